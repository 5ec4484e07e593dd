"""Records are standard safetensors files holding host tensors and a JSON header."""

from __future__ import annotations

import ast
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from nitro_core import (
    CheckpointCorrupt,
    Nitro,
    RecordError,
    checkpoint_info,
    read_manifest,
)
from nitro_core.examples import Classifier
from nitro_core.state.records import PREFIXES, decode_tree, encode_tree
from nitro_core.store import recordio as store

from .. import by_hand

REPO = Path(__file__).resolve().parents[3]


def test_writer_refuses_a_leaf_still_on_a_device_naming_its_path(tmp_path):
    tensors = {"params/ok": torch.zeros(2), "buffers/layer.stat": torch.empty(3, device="meta")}
    with pytest.raises(RecordError) as exc:
        store.write_record(tmp_path / "r.safetensors", tensors, {})
    assert str(exc.value) == (
        "Record leaf 'buffers/layer.stat' is on device meta, not on the host; every leaf must be "
        "converted with .cpu() before writing (records hold host tensors only)."
    )
    assert list(tmp_path.iterdir()) == []


def test_record_round_trips_every_dtype_and_is_plain_safetensors(tmp_path):
    tensors = {
        "params/w": torch.randn(3, 4),
        "params/h": torch.randn(5).half(),
        "params/b": torch.randn(2, 2).bfloat16(),
        "buffers/n": torch.tensor(7),
        "buffers/mask": torch.tensor([True, False]),
        "optim/empty": torch.zeros(0, 3),
    }
    path = tmp_path / "r.safetensors"
    size, digest = store.write_record(path, tensors, {"step": 3, "note": "é"})
    assert size == path.stat().st_size and digest == by_hand.tree(path)
    written = {"step": 3, "note": "é", "integrity": by_hand.integrity(path)}
    assert set(written["integrity"]["sections"]) == {"params", "buffers", "optim"}
    with safe_open(str(path), framework="pt") as f:
        assert json.loads(f.metadata()["nitro"]) == written
        for name, t in tensors.items():
            assert f.get_tensor(name).dtype == t.dtype and torch.equal(f.get_tensor(name), t)
    loaded, meta = store.read_record(path, digest)
    assert meta == written and loaded.keys() == tensors.keys()


def test_tree_codec_keeps_int_keys_tuples_and_tensors():
    tree = {
        "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.ones(2)}},
        "groups": [{"betas": (0.9, 0.99), "lr": 0.1}],
    }
    tensors: dict[str, torch.Tensor] = {}
    encoded = encode_tree(tree, "optim", tensors)
    json.dumps(encoded)  # JSON-ready
    assert sorted(tensors) == ["optim/state/0/exp_avg", "optim/state/0/step"]
    back = decode_tree(encoded, tensors)
    assert back["groups"] == [{"betas": (0.9, 0.99), "lr": 0.1}]
    assert torch.equal(back["state"][0]["exp_avg"], torch.ones(2))


def test_tree_codec_refuses_objects_instead_of_pickling():
    with pytest.raises(RecordError) as exc:
        encode_tree({"fn": print}, "optim/scheduler", {})
    assert "Record leaf 'optim/scheduler/fn' holds a builtin_function_or_method" in str(exc.value)


def test_a_training_record_holds_every_part_under_its_prefix(tmp_path):
    n = Nitro(Classifier(max_epochs=1, samples=128), run_dir=tmp_path).train()
    entry = read_manifest(tmp_path)[-1]
    with safe_open(str(tmp_path / entry.file), framework="pt") as f:
        names = list(f.keys())
    assert {p for p in PREFIXES if any(k.startswith(p) for k in names)} == set(PREFIXES)
    assert "buffers/1.running_mean" in names and "buffers/1.num_batches_tracked" in names
    assert "ema/0.weight" in names and "rng/torch" in names and "optim/state/0/exp_avg" in names
    meta = checkpoint_info(tmp_path / entry.file)
    assert (meta["epoch"], meta["step"], meta["seed"], meta["run"]) == (1, n.step, 0, n.run_id)
    assert meta["config"]["samples"] == 128 and meta["stop_reason"] == "completed"
    assert meta["layout"]["groups"] == [
        ["0.weight", "0.bias", "1.weight", "1.bias", "4.weight", "4.bias"]
    ]
    assert set(meta["rng"]) == {"python", "numpy"} and meta["logger"]["backend"] == "jsonl"
    assert meta["framework_version"] == "0.1.0" and meta["format_version"] == 2


def test_checkpoint_info_reads_the_header_only(tmp_path):
    path = tmp_path / "r.safetensors"
    store.write_record(path, {"params/w": torch.zeros(1000)}, {"epoch": 2})
    with open(path, "r+b") as f:  # destroy the tensor bytes: the header must still read
        (n,) = struct.unpack("<Q", f.read(8))
        f.seek(8 + n)
        f.write(b"\xff" * 4000)
    meta = checkpoint_info(path)
    assert meta.pop("integrity")["data_bytes"] == 4000 and meta == {"epoch": 2}


def test_checkpoint_info_refuses_a_truncated_record_naming_it(tmp_path):
    path = tmp_path / "r.safetensors"
    store.write_record(path, {"params/w": torch.zeros(1000)}, {"epoch": 2})
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CheckpointCorrupt) as exc:
        checkpoint_info(path)
    assert str(path) in str(exc.value) and "truncated" in str(exc.value)


_LAZY_FRONT_DOORS = (
    "nitro_core/__init__.py",
    "nitro_core/jobs/__init__.py",
    "nitro_mcp/__init__.py",
)


def test_nothing_in_nitro_calls_torch_load_pickle_or_eval():
    sources = [p for d in ("nitro_core", "nitro_mcp") for p in (REPO / d).rglob("*.py")]
    assert len(sources) > 10
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else ast.unparse(func)
                banned = (
                    "eval",
                    "exec",
                    "torch.load",
                    "ast.literal_eval",
                    "__import__",
                    "importlib.import_module",
                )
                # the one import of a module by name: operator-given --experiment-module, never client text
                # and the package's lazy front door, whose table of module names is a constant
                allowed = name == "importlib.import_module" and (
                    path.name == "registry.py"
                    or path.relative_to(REPO).as_posix() in _LAZY_FRONT_DOORS
                )
                assert name not in banned or allowed, f"{path}:{node.lineno} calls {name}"
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not {"pickle", "dill", "cloudpickle"} & set(names), (
                    f"{path}:{node.lineno} imports pickle"
                )


def test_importing_nitro_core_prints_nothing():
    out = subprocess.run(
        [sys.executable, "-c", "import nitro_core, nitro_core.examples"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == ""
