"""``nitro_export(..., format="hf")`` through a real MCP client and ``nitro export`` through
a real CLI process (issue 23): the directory is written inside the root, transformers'
``from_pretrained`` loads it with Nitro's logits, the refusals say what to write, and an
experiment of an ``--experiment-module`` gives its model's config through the server's
registry. Tiny transformers models built from configs; nothing is downloaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
import torch
from mcp import Client
from safetensors.torch import load_file

from nitro_core import ConfigError, Nitro, export_hf, read_manifest
from nitro_core.examples import HFCausalLM, Regression
from nitro_core.registry import load_module
from nitro_mcp.server import build_server

from .conftest import call

transformers = pytest.importorskip("transformers")
TINY = dict(vocab=32, context=8, width=16, heads=2, depth=1, samples=32, batch_size=8)
TOKENS = [[1, 5, 7, 3, 9, 2, 4, 8], [0, 31, 30, 2, 2, 6, 11, 12]]
AVERAGE = "latest => Average(Last(2))"
MODULE = '''from nitro_core.examples import HFCausalLM


class TinyLM(HFCausalLM):
    """An operator's own transformers experiment: a Llama with its own field."""

    arch: str = "llama"
    note: str = "mine"
'''
ERR = "Error executing tool nitro_export: "


def logits_of(model: torch.nn.Module) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor(TOKENS)).logits


def calls(root: Path, *todo: tuple[str, dict], modules: tuple[str, ...] = ()) -> list[tuple]:
    async def main():
        async with Client(build_server(root, experiment_modules=modules)) as client:
            return [await call(client, name, **args) for name, args in todo]

    return anyio.run(main)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runs/HFCausalLM (a tied GPT-2, 2 epochs), runs/reg (a Regression), runs/TinyLM (an
    experiment of the module exps.py, a Llama), trained in this process."""
    base = tmp_path_factory.mktemp("root")
    Nitro(HFCausalLM(**TINY), run_dir=base / "runs/HFCausalLM", seed=0).train()
    Nitro(Regression(samples=64, hidden=8, max_epochs=1), run_dir=base / "runs/reg").train()
    (base / "exps.py").write_text(MODULE)
    (tiny_lm,) = [cls for _, cls in load_module("exps.py", base).classes]
    Nitro(tiny_lm(**TINY, max_epochs=1), run_dir=base / "runs/TinyLM", seed=0).train()
    return base


def test_nitro_export_format_hf_writes_a_directory_transformers_loads_with_nitro_s_logits(root):
    args = {"source": AVERAGE, "run_dir": "runs/HFCausalLM", "format": "hf"}
    [(err, out), (err2, again), (err3, dtype), (err4, size), (err5, outside), (err6, plain)] = calls(
        root, ("nitro_export", {**args, "path": "exports/hf"}),
        ("nitro_export", {**args, "path": "exports/hf"}),
        ("nitro_export", {**args, "path": "exports/b", "dtype": "int8"}),
        ("nitro_export", {**args, "path": "exports/c", "max_shard_size": "5 gigs"}),
        ("nitro_export", {**args, "path": "../hf"}),
        ("nitro_export", {**args, "path": "exports/d", "format": "weights", "dtype": "bfloat16"}),
    )  # fmt: skip
    assert not err, out
    written = root / "exports/hf"
    last = read_manifest(root / "runs/HFCausalLM")[-1]
    assert out == {
        "path": "exports/hf", "bytes": sum(p.stat().st_size for p in written.iterdir()),
        "source_file": f"runs/HFCausalLM/{last.file}", "run": last.run, "epoch": 2,
        "step": last.step, "experiment": "HFCausalLM", "averaged_files": 2,
        "next": "AutoModelForCausalLM.from_pretrained('exports/hf') loads it; "
        "weights='hf:exports/hf' starts a run from it.",
    }  # fmt: skip
    assert sorted(p.name for p in written.iterdir()) == [
        "config.json", "model.safetensors", "nitro_provenance.json",
    ]  # fmt: skip
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(written))
    assert loaded.lm_head.weight is loaded.transformer.wte.weight  # tied back
    average = Nitro(HFCausalLM(**TINY), run_dir=root / "runs/HFCausalLM", weights=AVERAGE)
    assert torch.equal(logits_of(loaded), logits_of(average.model))
    assert err2 and again == (
        f"{ERR}path='exports/hf' already exists; Nitro never overwrites it. Choose a new name."
    )
    assert err3 and dtype == (
        f"{ERR}dtype='int8' is not one of 'float32', 'float16', 'bfloat16'; send e.g. "
        "dtype='float32'."
    )
    assert err4 and size == (
        f"{ERR}max_shard_size='5 gigs' is not a size; write a positive number of bytes or a "
        "string such as '5GB', '500MB' or '2GiB'."
    )
    assert err5 and outside == (
        f"{ERR}path='../hf' resolves to {str(root.parent / 'hf')!r}, outside the server's root "
        f"{str(root)!r}; give a path inside it, e.g. path='runs/Classifier/weights.safetensors'."
    )
    assert err6 and plain == (
        f"{ERR}dtype and max_shard_size are options of format='hf'; write nitro_export(source="
        f"{AVERAGE!r}, path='exports/d', format='hf', ...) or drop them."
    )
    assert sorted(p.name for p in (root / "exports").iterdir()) == ["hf"]  # nothing else left
    assert not (root.parent / "hf").exists()


def test_a_sharded_bf16_export_through_the_tool_loads_as_bf16(root):
    [(err, out)] = calls(
        root, ("nitro_export", {"source": "latest => best", "run_dir": "runs/HFCausalLM",
               "format": "hf", "path": "exports/half", "dtype": "bfloat16",
               "max_shard_size": "3000"}),
    )  # fmt: skip
    assert not err, out
    written = root / "exports/half"
    index = json.loads((written / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(written), dtype="auto")
    assert loaded.dtype == torch.bfloat16


def test_an_experiment_module_s_model_config_comes_from_the_server_s_registry(root):
    args = {"source": "latest => best", "run_dir": "runs/TinyLM", "format": "hf"}
    [(err, out)] = calls(root, ("nitro_export", {**args, "path": "exports/mine"}),
                         modules=("exps.py",))  # fmt: skip
    assert not err, out
    assert out["experiment"] == "TinyLM"
    config = json.loads((root / "exports/mine/config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(root / "exports/mine"))
    assert type(loaded).__name__ == "LlamaForCausalLM"
    # a server without the module, and export_hf in Python, cannot know that model's config
    [(err, refused), (err2, not_hf)] = calls(
        root, ("nitro_export", {**args, "path": "exports/mine-2"}),
        ("nitro_export", {**args, "path": "exports/reg", "run_dir": "runs/reg"}),
    )  # fmt: skip
    assert err and refused == (
        f"{ERR}export_hf needs config= for 'latest => best': its experiment (TinyLM) is not a "
        "registered experiment, so its model's config is unknown. Start the server with "
        "--experiment-module naming the module that defines it (nitro_experiments lists the "
        "registered ones), or export format='weights' (its state dict), or write the directory "
        "in Python with export_hf(source, out_dir, config=...)."
    )
    assert err2 and not_hf == (
        f"{ERR}export_hf needs config= for 'latest => best': the model of its experiment "
        "Regression is a Sequential, not a transformers model with a .config. nitro_export takes "
        "no config: export format='weights' (its state dict), or write the directory in Python "
        "with export_hf(source, out_dir, config=...)."
    )
    with pytest.raises(ConfigError) as exc:
        export_hf("latest => best", root / "exports/py", run_dir=root / "runs/TinyLM")
    assert str(exc.value) == (
        "export_hf needs config= for 'latest => best': its experiment (TinyLM) is not a "
        "registered experiment, so its model's config is unknown. Write export_hf(source, "
        "out_dir, config=GPT2Config(...)) or config=n.model.config."
    )
    assert not any((root / "exports" / n).exists() for n in ("mine-2", "reg", "py"))


# -- the CLI, a real process --------------------------------------------------------------------
def nitro(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nitro_mcp.cli", *argv],
        cwd=cwd, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.mark.slow  # four processes that import torch and transformers (~18 s)
def test_nitro_export_format_hf_and_plain_weights_from_the_terminal(root, tmp_path):
    run_dir = str(root / "runs/HFCausalLM")
    done = nitro("export", AVERAGE, "cli-hf", "--run-dir", run_dir, "--format", "hf",
                 "--max-shard-size", "3000", "--json", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    files = sorted(p.name for p in (tmp_path / "cli-hf").iterdir())
    shards = [f for f in files if f.startswith("model-")]
    reply = json.loads(done.stdout)  # the nitro_export tool's reply
    assert len(shards) > 1 and Path(reply["path"]).name == "cli-hf"
    assert reply["averaged_files"] == 2 and reply["run"] is not None
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "cli-hf"))
    average = Nitro(HFCausalLM(**TINY), run_dir=run_dir, weights=AVERAGE)
    assert torch.equal(logits_of(loaded), logits_of(average.model))

    done = nitro("export", "latest => best", "w.safetensors", "--run-dir", run_dir, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("wrote ") and "w.safetensors" in done.stdout.splitlines()[0]
    weights = load_file(tmp_path / "w.safetensors")
    assert weights.keys() == HFCausalLM(**TINY).build_model().state_dict().keys()

    refusals = [
        (("export", AVERAGE, "cli-hf", "--run-dir", run_dir, "--format", "hf"),
         f"nitro export: path='{tmp_path / 'cli-hf'}' already exists; Nitro never overwrites it. "
         "Choose a new name.\n"),
        (("export", AVERAGE, "x", "--run-dir", run_dir, "--format", "hf", "--max-shard-size", "big"),
         "nitro export: max_shard_size='big' is not a size; write a positive number of bytes or a "
         "string such as '5GB', '500MB' or '2GiB'.\n"),
        (("export", AVERAGE, "y.safetensors", "--run-dir", run_dir, "--dtype", "bfloat16"),
         "nitro export: --dtype and --max-shard-size are options of --format hf; add --format hf "
         "or drop them.\n"),
    ]  # fmt: skip
    for argv, text in refusals:
        done = nitro(*argv, cwd=tmp_path)
        assert (done.returncode, done.stderr, done.stdout) == (2, text, ""), argv  # refused
    done = nitro("export", AVERAGE, "z", "--format", "hf", "--dtype", "int8", cwd=tmp_path)
    assert done.returncode == 2 and "argument --dtype: invalid choice: 'int8'" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli-hf", "w.safetensors"]
