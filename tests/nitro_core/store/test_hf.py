"""The Hugging Face round trip (issue 23, DESIGN.md section 15): every weights export
carries ``"format": "pt"``; ``export_hf`` writes a directory transformers' ``from_pretrained``
loads in a fresh process with the Nitro model's logits, bit for bit; ``weights="hf:<dir>"``
reads one back; bad input is refused with what to write. Models are built from configs,
nothing is downloaded."""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from nitro_core import ConfigError, Nitro, SourceSyntaxError, export_weights, parse_source
from nitro_core.errors import CheckpointNotFound
from nitro_core.examples import HFCausalLM, Regression
from nitro_core.sources.grammar import HFDirectory
from nitro_core.store.atomic import PublishDirectory
from nitro_core.store.hf import clear_leftovers, parse_size

transformers = pytest.importorskip("transformers")
LOADER = Path(__file__).parents[1] / "hf_load.py"
OLD = os.environ.get("NITRO_TRANSFORMERS_4")  # a site directory holding transformers 4.x
TINY = dict(vocab=32, context=8, width=16, heads=2, depth=1, samples=32, batch_size=8)
TOKENS = [[1, 5, 7, 3, 9, 2, 4, 8], [0, 31, 30, 2, 2, 6, 11, 12]]


def files_of(directory: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for p in sorted(directory.glob("*.safetensors")):
        with safe_open(str(p), "pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return out


def logits_of(model: torch.nn.Module) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor(TOKENS)).logits


def load_fresh(directory: Path, tmp: Path, site: str | None = None) -> tuple[dict, torch.Tensor]:
    """from_pretrained(directory) in a new interpreter (``site``: transformers from there)."""
    env = dict(os.environ, PYTHONPATH=site) if site else dict(os.environ)
    out = tmp / f"loaded-{directory.name}"
    subprocess.run(
        [sys.executable, str(LOADER), str(directory), json.dumps(TOKENS), str(out)],
        check=True, env=env, timeout=600, capture_output=True,
    )  # fmt: skip
    with safe_open(str(out) + ".safetensors", "pt") as f:
        logits = f.get_tensor("logits")
    return json.loads(Path(str(out) + ".json").read_text()), logits


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Nitro, Path]:
    """An untrained tiny GPT-2 handle (tied head) and its export_hf directory."""
    base = tmp_path_factory.mktemp("tiny")
    n = Nitro(HFCausalLM(**TINY), run_dir=base / "runs", seed=0)
    from nitro_core import export_hf

    return n, export_hf(n, base / "hf")


# -- fast: the format key, the grammar, the directory, refusals -----------------------------------
def test_every_weights_export_carries_format_pt_and_transformers_load_state_dict_reads_it(tmp_path):
    n = Nitro(Regression(), run_dir=tmp_path / "runs", seed=0)
    out = export_weights(n, tmp_path / "w.safetensors")
    with safe_open(str(out), "pt") as f:
        meta = f.metadata()
    assert meta["format"] == "pt" and "nitro" in meta
    from transformers.modeling_utils import load_state_dict

    loaded = load_state_dict(str(out))
    assert loaded.keys() == n.model.state_dict().keys()


@pytest.mark.slow  # transformers 4 in a subprocess: the slow suite (the default stays under 4 minutes)
@pytest.mark.skipif(
    OLD is None, reason="set NITRO_TRANSFORMERS_4 to a site dir with transformers 4.x"
)
def test_transformers_4_load_state_dict_reads_a_plain_export_and_refuses_one_without_format(
    tmp_path,
):
    n = Nitro(Regression(), run_dir=tmp_path / "runs", seed=0)
    out = export_weights(n, tmp_path / "w.safetensors")
    bare = tmp_path / "bare.safetensors"
    from safetensors.torch import save_file

    save_file(n.model.state_dict(), str(bare), metadata={"nitro": "{}"})  # no "format"
    script = (
        "import sys, transformers; from transformers.modeling_utils import load_state_dict\n"
        "assert transformers.__version__.startswith('4.'), transformers.__version__\n"
        "print(sorted(load_state_dict(sys.argv[1])))\n"
        "try:\n    load_state_dict(sys.argv[2])\nexcept OSError as e:\n    print('refused:', e)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(OLD))
    done = subprocess.run(
        [sys.executable, "-c", script, str(out), str(bare)],
        env=env, capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    assert str(sorted(n.model.state_dict())) in done.stdout
    assert "refused: " in done.stdout and "does not contain the valid metadata" in done.stdout


@pytest.mark.parametrize(
    "text, path",
    [("hf:models/gpt2-tiny", "models/gpt2-tiny"), ("  hf: /abs/dir ", "/abs/dir")],
)
def test_hf_source_parses_to_a_directory_and_prints_back(text, path):
    src = parse_source(text)
    assert src == HFDirectory(path) and str(src) == f"hf:{path}"
    assert parse_source(str(src)) == src


@pytest.mark.parametrize(
    "text, found", [("hf:", "nothing after it"), ("hf:a => best", "'=>' after it")]
)
def test_hf_source_without_a_directory_is_refused(text, found):
    with pytest.raises(SourceSyntaxError) as exc:
        parse_source(text)
    assert str(exc.value) == (
        f"Cannot parse source {text!r}: 'hf:' takes a Hugging Face model directory and found "
        f"{found}. Write 'hf:' and the directory, e.g. 'hf:models/gpt2-tiny'."
    )


def test_an_hf_directory_without_weights_is_refused_with_what_to_write(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(CheckpointNotFound) as exc:
        Nitro(Regression(), run_dir=tmp_path / "runs", weights=f"hf:{d}")
    assert str(exc.value) == (
        f"Source 'hf:{d}' holds no weights: {str(d)!r} has neither model.safetensors nor "
        "model.safetensors.index.json (it holds ['config.json', 'pytorch_model.bin']) (a "
        "pytorch_model.bin is a pickle, which Nitro never loads). Write hf: and a directory that "
        "save_pretrained(dir, safe_serialization=True) or export_hf() wrote."
    )


def test_export_hf_refuses_an_existing_out_dir_and_leaves_it_as_it_was(tmp_path):
    from nitro_core import export_hf

    out = tmp_path / "hf"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    with pytest.raises(ConfigError) as exc:
        export_hf("latest => best", out, run_dir=tmp_path)
    assert str(exc.value) == (
        f"out_dir {str(out)!r} already exists; export_hf never writes into or over it. Choose a "
        f"new directory, e.g. out_dir={str(out.with_name('hf-2'))!r}, or delete the old one first."
    )
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no temporary left beside it


def test_a_new_directory_is_never_published_over_one_that_appeared_meanwhile(tmp_path):
    for held in ([], ["other.json"]):  # an empty directory, and one with a file
        out = tmp_path / f"out{len(held)}"
        out.mkdir()
        for name in held:
            (out / name).write_text("theirs")
        tmp = tmp_path / f"tmp{len(held)}"
        tmp.mkdir()
        with pytest.raises(ConfigError, match="already exists"):
            PublishDirectory(out, tmp, "last.json", new=True).commit(lambda f: f.write(b"{}"))
        assert sorted(p.name for p in out.iterdir()) == held


@pytest.mark.parametrize(
    "value, size", [(1000, 1000), ("5GB", 5 * 10**9), ("500MB", 5 * 10**8), ("2GiB", 2 * 2**30)]
)
def test_max_shard_size_reads_as_transformers_reads_it(value, size):
    assert parse_size(value) == size


def test_a_bad_max_shard_size_is_refused():
    with pytest.raises(ConfigError) as exc:
        parse_size("5 gigs")
    assert str(exc.value) == (
        "max_shard_size='5 gigs' is not a size; write a positive number of bytes or a string "
        "such as '5GB', '500MB' or '2GiB'."
    )


def test_export_hf_leaves_tied_names_out_and_hf_weights_tie_them_back(tiny, tmp_path):
    n, out = tiny
    written = files_of(out)
    assert "lm_head.weight" not in written and "transformer.wte.weight" in written
    prov = json.loads((out / "nitro_provenance.json").read_text())
    assert prov["tied"] == {"lm_head.weight": "transformer.wte.weight"}
    assert prov["run"] == n.run_id and set(prov["shards"]) == {"model.safetensors"}
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert f.metadata()["format"] == "pt"
    m = Nitro(HFCausalLM(**TINY), run_dir=tmp_path / "runs", seed=1, weights=f"hf:{out}")
    assert m.model.lm_head.weight is m.model.transformer.wte.weight
    mine, theirs = n.model.state_dict(), m.model.state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_a_config_whose_shapes_do_not_fit_is_refused_naming_the_leaf(tiny, tmp_path):
    from nitro_core import export_hf

    n, _ = tiny
    wrong = transformers.GPT2Config(
        vocab_size=40, n_positions=8, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0
    )
    with pytest.raises(ConfigError) as exc:
        export_hf(n, tmp_path / "hf", config=wrong)
    assert str(exc.value) == (
        "export_hf: the config does not fit the weights: leaf 'transformer.wte.weight' has size "
        "[32, 16] in the weights and [40, 16] in the GPT2LMHeadModel the config describes. Pass "
        "the config the model was trained with (config=n.model.config), or leave config out to "
        "use the model's own."
    )
    assert not (tmp_path / "hf").exists()


def test_hf_weights_that_do_not_fit_the_model_are_refused_naming_both_shapes(tiny, tmp_path):
    _, out = tiny
    wider = HFCausalLM(**{**TINY, "vocab": 48})
    with pytest.raises(ConfigError) as exc:
        Nitro(wider, run_dir=tmp_path / "runs", weights=f"hf:{out}")
    assert str(exc.value).startswith(
        f"Checkpoint {str(out)!r} does not fit HFCausalLM's model: leaf 'transformer.wte.weight' "
        "has size [32, 16] in the record and [48, 16] in the model."
    )


# -- slow: train, average, load in a fresh process ---------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("arch, tie", [("gpt2", True), ("llama", True), ("llama", False)])
def test_an_averaged_export_loads_in_transformers_with_nitro_s_logits(arch, tie, tmp_path):
    from nitro_core import export_hf

    exp = HFCausalLM(**TINY, arch=arch, tie=tie)
    Nitro(exp, run_dir=tmp_path / "runs", seed=0).train()  # 2 epochs
    source = "latest => Average(Last(2))"
    out = export_hf(source, tmp_path / "hf", run_dir=tmp_path / "runs")
    avg = Nitro(exp, run_dir=tmp_path / "runs", seed=3, weights=source)
    expected = logits_of(avg.model)
    prov = json.loads((out / "nitro_provenance.json").read_text())
    assert prov["averaged_from"]["epochs"] == [1, 2] and prov["epoch"] == 2
    for site in [None, *([OLD] if OLD else [])]:
        report, logits = load_fresh(out, tmp_path, site)
        assert report["missing"] == [] and report["unexpected"] == [], report
        assert report["tied"] is tie
        assert logits.dtype == torch.float32 and torch.equal(logits, expected), report["version"]


@pytest.mark.slow
def test_a_sharded_export_loads_the_same_and_a_bf16_export_loads_as_bf16(tmp_path):
    from nitro_core import export_hf

    exp = HFCausalLM(**TINY, arch="llama")
    n = Nitro(exp, run_dir=tmp_path / "runs", seed=0).train()
    expected = logits_of(n.model)
    sharded = export_hf(n, tmp_path / "sharded", max_shard_size=4000)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    written = files_of(sharded)
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in written.values())
    report, logits = load_fresh(sharded, tmp_path)
    assert report["missing"] == [] and report["unexpected"] == [] and torch.equal(logits, expected)
    half = export_hf(n, tmp_path / "bf16", dtype="bfloat16")
    assert {t.dtype for t in files_of(half).values()} == {torch.bfloat16}
    report, logits = load_fresh(half, tmp_path)
    assert report["dtype"] == "torch.bfloat16" and logits.dtype == torch.bfloat16
    cast = {k: v.to(torch.bfloat16) for k, v in n.model.state_dict().items()}
    assert all(torch.equal(files_of(half)[k], cast[k]) for k in files_of(half))


@pytest.mark.slow
def test_hf_weights_then_export_hf_round_trip_bit_for_bit(tmp_path):
    from nitro_core import export_hf

    exp = HFCausalLM(**TINY)
    n = Nitro(exp, run_dir=tmp_path / "runs", seed=0).train()
    first = export_hf(n, tmp_path / "first", max_shard_size=3000)
    m = Nitro(exp, run_dir=tmp_path / "again", seed=5, weights=f"hf:{first}")
    second = export_hf(m, tmp_path / "second", max_shard_size=3000)
    a, b = files_of(first), files_of(second)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((first / "config.json").read_text()) == json.loads(
        (second / "config.json").read_text()
    )
    assert (first / "model.safetensors.index.json").read_text() == (
        second / "model.safetensors.index.json"
    ).read_text()


# -- a killed export: its temporary is never loaded, and the next export removes it ---------------
STALL = """import json, sys, time
from pathlib import Path
from nitro_core import Nitro, export_hf
from nitro_core.examples import HFCausalLM
from nitro_core.store import hf
out, marker, tiny, runs = sys.argv[1:]
real = hf.write_record

def stalled(path, *args, **kwargs):
    written = real(path, *args, **kwargs)
    Path(marker).write_text(str(path))  # one shard is in the temporary: kill me now
    time.sleep(600)
    return written

hf.write_record = stalled
export_hf(Nitro(HFCausalLM(**json.loads(tiny)), run_dir=runs, seed=0), out, max_shard_size=3000)
"""


def wait_for_file(path: Path, proc: subprocess.Popen, limit: float = 600) -> None:
    deadline = time.monotonic() + limit
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, f"{path} did not appear within {limit} s"
        time.sleep(0.01)


@pytest.mark.slow  # a real worker killed or followed for epochs: `pytest -m slow`
def test_a_killed_export_leaves_a_temporary_that_hf_refuses_and_the_next_export_removes(tmp_path):
    from nitro_core import export_hf

    out, marker = tmp_path / "hf", tmp_path / "marker"
    argv = [str(out), str(marker), json.dumps(TINY), str(tmp_path / "runs")]
    proc = subprocess.Popen([sys.executable, "-c", STALL, *argv], stderr=subprocess.PIPE)
    try:
        wait_for_file(marker, proc)
        (alive,) = tmp_path.glob("hf.tmp-*")
        assert clear_leftovers(out) == [] and alive.is_dir()  # its writer holds it locked
    finally:
        proc.kill()  # SIGKILL
        proc.communicate(timeout=600)
    assert proc.returncode == -signal.SIGKILL
    (left,) = tmp_path.glob("hf.tmp-*")
    assert re.fullmatch(r"hf\.tmp-[a-z0-9_]{8}", left.name) and not out.exists()
    assert [p.name for p in left.iterdir()] == [Path(marker.read_text()).name]
    with pytest.raises(CheckpointNotFound) as exc:
        Nitro(HFCausalLM(**TINY), run_dir=tmp_path / "runs", weights=f"hf:{left}")
    assert str(exc.value) == (
        f"Source 'hf:{left}' is the temporary directory of an export_hf that did not finish (a "
        "killed writer's), which Nitro never loads; the next export_hf to that out_dir removes "
        "it. Write hf: and the published directory, or run export_hf again."
    )
    n = Nitro(HFCausalLM(**TINY), run_dir=tmp_path / "runs", seed=0)
    export_hf(n, out, max_shard_size=3000)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "marker"]  # the temporary went
    m = Nitro(HFCausalLM(**TINY), run_dir=tmp_path / "again", weights=f"hf:{out}")
    mine, theirs = n.model.state_dict(), m.model.state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_the_next_export_leaves_a_live_writer_s_temporary_and_other_names_alone(tiny, tmp_path):
    from nitro_core import export_hf

    n, _ = tiny
    live, dead, mine = (
        tmp_path / name for name in ("hf.tmp-live0000", "hf.tmp-dead0000", "hf.tmp-mine")
    )
    for d in (live, dead, mine, tmp_path / "hf2.tmp-dead0000", tmp_path / "elsewhere"):
        d.mkdir()
        (d / "shard.safetensors").write_bytes(b"part")
    (tmp_path / "hf.tmp-link0000").symlink_to(tmp_path / "elsewhere")
    fd = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a writer still running holds it
        export_hf(n, tmp_path / "hf")
    finally:
        os.close(fd)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "elsewhere", "hf", "hf.tmp-link0000", "hf.tmp-live0000", "hf.tmp-mine", "hf2.tmp-dead0000",
    ]  # fmt: skip
    assert (tmp_path / "elsewhere" / "shard.safetensors").read_bytes() == b"part"
    assert (live / "shard.safetensors").read_bytes() == b"part"
