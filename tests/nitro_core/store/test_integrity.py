"""Every record is checked when it is read, listed or not: the manifest's digest covers a
listed record's header, whose ``integrity`` block covers each section of its tensor bytes,
so records no manifest lists (saved averages, exports) are checked too. Exports load back
as weights. The commit protocol's directory fsync, and averaging's offsets past 4 MB."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from nitro_core import (
    CheckpointCorrupt,
    Checkpointer,
    ConfigError,
    Last,
    Nitro,
    ResumeRefused,
    average_checkpoints,
    checkpoint_info,
    export_weights,
    read_manifest,
)
from nitro_core.store import recordio as store

from .. import by_hand, commit_steps
from ..tiny import KeepLast, Tiny


class KeepThree(Tiny):
    def checkpointer(self):
        return Checkpointer(keep=Last(3))


def data_section(path: Path) -> bytes:
    raw = path.read_bytes()
    return raw[8 + int.from_bytes(raw[:8], "little") :]


def flip_a_params_bit(path: Path) -> None:
    begin, end = by_hand.section_range(path, "params")
    raw = bytearray(path.read_bytes())
    raw[(begin + end) // 2] ^= 0x10
    path.write_bytes(bytes(raw))


def section_refusal(path: Path, section: str) -> str:
    actual = by_hand.sections(path)[section]
    recorded = checkpoint_info(path)["integrity"]["sections"][section]
    return (
        f"Checkpoint {str(path)!r} is corrupt: its {section!r} section digests to "
        f"xxh3-128:{actual[:16]}..., its header recorded xxh3-128:{recorded[:16]}... when it "
        "was written. Load another checkpoint or restore this file from a backup."
    )


@pytest.fixture
def run(tmp_path):
    d = tmp_path / "run"
    n = Nitro(KeepThree(max_epochs=3), run_dir=d).train()
    n.logger.close()
    return n, d


# -- the digest in every header ------------------------------------------------------------------
def test_every_record_nitro_writes_carries_the_digest_of_each_section(run, tmp_path):
    n, d = run
    avg, export = tmp_path / "avg.safetensors", tmp_path / "export.safetensors"
    average_checkpoints(d, "latest => Average(Last(3))", save=avg)
    export_weights(n, export)
    for e in read_manifest(d):
        assert e.digest == by_hand.tree(d / e.file), e.file
    for path in [d / e.file for e in read_manifest(d)] + [avg, export]:
        assert checkpoint_info(path)["integrity"] == by_hand.integrity(path), path.name
    assert set(by_hand.sections(export)) == {"tensors"}  # plain state-dict keys
    assert set(by_hand.sections(avg)) == {"params"}  # a Linear: no layer state, no EMA


@pytest.mark.parametrize("kind", ["average", "export"])
def test_a_bitflipped_record_outside_the_manifest_is_refused_when_loaded(run, tmp_path, kind):
    n, d = run
    path = tmp_path / f"{kind}.safetensors"
    if kind == "average":
        average_checkpoints(d, "latest => Average(Last(3))", save=path)
    else:
        export_weights(n, path)
    section = "params" if kind == "average" else "tensors"
    begin, end = by_hand.section_range(path, section)
    raw = bytearray(path.read_bytes())
    raw[(begin + end) // 2] ^= 0x10
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointCorrupt) as exc:
        Nitro(KeepThree(), run_dir=tmp_path / "other", weights=str(path))
    assert str(exc.value) == section_refusal(path, section)
    with pytest.raises(CheckpointCorrupt) as exc:
        store.read_record(path)
    assert str(exc.value) == section_refusal(path, section)


def test_a_record_written_before_the_digest_still_loads(run, tmp_path):
    n, d = run
    source = d / read_manifest(d)[-1].file
    tensors, meta = store.read_record(source)
    del meta["integrity"]
    meta["format_version"] = 1  # what a record written before any digest says
    old = tmp_path / "old.safetensors"
    save_file(tensors, str(old), metadata={"nitro": json.dumps(meta)})
    w = Nitro(KeepThree(), run_dir=tmp_path / "other", weights=str(old))
    w.logger.close()
    for k, v in n.model.state_dict().items():
        assert torch.equal(w.model.state_dict()[k], v), k


# -- listed records: the manifest's digest, in averaging too -------------------------------------
def _change_the_seed_in_the_header(path: Path) -> None:
    """Alter the header, not the tensor bytes: only the manifest's digest can tell."""
    raw = path.read_bytes()
    assert raw.count(b'\\"seed\\":0') == 1 or raw.count(b'"seed":0') == 1
    old = b'\\"seed\\":0' if b'\\"seed\\":0' in raw else b'"seed":0'
    path.write_bytes(raw.replace(old, old[:-1] + b"1"))


def test_averaging_checks_each_listed_record_against_the_manifest_digest(run):
    _, d = run
    entry = read_manifest(d)[0]
    path = d / entry.file
    _change_the_seed_in_the_header(path)
    actual = by_hand.tree(path)
    assert entry.digest is not None and actual != entry.digest
    with pytest.raises(CheckpointCorrupt) as exc:
        average_checkpoints(d, "latest => Average(Last(3))")
    assert str(exc.value) == (
        f"Checkpoint {str(path)!r} is corrupt: its header digests to {actual[:30]}..., the "
        f"manifest recorded {entry.digest[:30]}... when it was written. Load another checkpoint "
        "(read_manifest lists them) or restore this file from a backup."
    )


def test_bytes_appended_after_a_records_end_are_refused(run):
    _, d = run
    entry = read_manifest(d)[-1]
    path = d / entry.file
    with open(path, "ab") as f:
        f.write(b"\0" * 16)
    expected = f"Checkpoint {str(path)!r} has bytes past the end its header describes."
    with pytest.raises(CheckpointCorrupt) as exc:
        store.read_record(path)  # no manifest digest: the sections alone would pass
    assert str(exc.value) == expected
    with pytest.raises(CheckpointCorrupt) as exc:
        average_checkpoints(d, "latest => Average(Last(3))")
    assert str(exc.value) == expected


# -- averaging tensors larger than a streamed piece ---------------------------------------------
BIG = 1_500_001  # float32: 6 MB, so one tensor spans two 4 MB pieces and a tail


class _WithBig(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)
        self.big = torch.nn.Parameter(torch.linspace(-1.0, 1.0, BIG))

    def forward(self, x):
        return self.linear(x)


class BigParam(KeepThree):
    def build_model(self):
        return _WithBig()

    def loss(self, model, batch):
        return super().loss(model, batch) + model.big.pow(2).mean()


@pytest.mark.parametrize("group", [16, 2])  # records read side by side: one pass, or two groups
def test_averaging_tensors_over_4_mb_equals_a_straightforward_mean(tmp_path, group, monkeypatch):
    from nitro_core import averaging

    monkeypatch.setattr(averaging, "_GROUP", group)
    Nitro(BigParam(max_epochs=3), run_dir=tmp_path).train().logger.close()
    paths = [tmp_path / e.file for e in read_manifest(tmp_path)]
    assert len(paths) == 3
    result = average_checkpoints(tmp_path, "latest => Average(Last(3))")
    for key in ("big", "linear.weight"):
        total = None
        for p in paths:
            with safe_open(str(p), framework="pt") as f:
                t = f.get_tensor(f"params/{key}").to(torch.float64)
            total = t if total is None else total + t
        expected = (total / 3).to(torch.float32)
        assert torch.equal(result.state[key], expected), key
    first = safe_open(str(paths[0]), framework="pt").get_tensor("params/big")
    assert not torch.equal(result.state["big"], first)  # the epochs differ: a real average
    data = data_section(paths[0])
    assert len(data) > 2 * 4 * 1024 * 1024  # several pieces of a read, the last one partial
    assert checkpoint_info(paths[0])["integrity"] == by_hand.integrity(paths[0])
    assert torch.equal(store.read_record(paths[0])[0]["params/big"], first)  # checked as read


# -- the commit protocol ---------------------------------------------------------------------------
def test_a_record_commit_fsyncs_the_directory_right_after_the_rename(tmp_path, monkeypatch):
    steps = commit_steps.record(monkeypatch, tmp_path)
    Nitro(KeepThree(max_epochs=1), run_dir=tmp_path).train().logger.close()
    record = read_manifest(tmp_path)[0].file
    at = steps.index(("replace", f"{record}.tmp", record))
    assert steps[at - 1] == ("fsync", f"{record}.tmp"), steps  # its bytes, before the rename
    assert steps[at + 1] == ("fsync", "."), steps


# -- exports load back as weights -----------------------------------------------------------------
def test_an_export_loads_back_as_weights_with_identical_parameters(run, tmp_path):
    n, d = run
    out = tmp_path / "export.safetensors"
    export_weights(n, out)
    w = Nitro(KeepThree(), run_dir=tmp_path / "new", weights=str(out))
    w.logger.close()
    assert w.checkpoint_source == out
    state = n.model.state_dict()
    assert w.model.state_dict().keys() == state.keys()
    for k, v in w.model.state_dict().items():
        assert torch.equal(v, state[k]), k
    from_source = tmp_path / "best.safetensors"
    export_weights("latest => best", from_source, run_dir=d)
    Nitro(KeepThree(), run_dir=tmp_path / "new2", weights=str(from_source)).logger.close()


def test_an_export_refuses_resume_and_restore_optimizer_saying_what_to_write(run, tmp_path):
    n, _ = run
    out = tmp_path / "export.safetensors"
    export_weights(n, out)
    with pytest.raises(ResumeRefused) as exc:
        Nitro(KeepThree(), run_dir=tmp_path / "new", resume=str(out))
    assert str(exc.value) == (
        f"Cannot resume {str(out)!r}: it holds weights only, no optimizer state, step or RNG. "
        f"Start a new run from it with weights={str(out)!r}."
    )
    with pytest.raises(ConfigError) as exc:
        Nitro(KeepThree(), run_dir=tmp_path / "new", weights=str(out), restore_optimizer=True)
    assert str(exc.value) == (
        f"restore_optimizer=True, but {str(out)!r} holds weights only (an export or an "
        "average), no optimizer state. Drop restore_optimizer to load its weights with a fresh "
        "optimizer."
    )


def test_the_manifest_bytes_are_fsynced_before_the_rename_publishes_them(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.fstat(fd).st_ino))
        return real_fsync(fd)

    def replace(src, dst, *args, **kwargs):
        events.append(("replace", os.stat(src).st_ino))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    with store.manifest_lock(tmp_path):
        store.save_manifest_json(tmp_path, {"format": "nitro-manifest/1", "entries": []})
    inode = (tmp_path / store.MANIFEST_NAME).stat().st_ino
    assert ("replace", inode) in events
    assert ("fsync", inode) in events[: events.index(("replace", inode))]


def test_a_resume_checks_its_record_against_the_manifest_digest(tmp_path):
    Nitro(KeepLast(), run_dir=tmp_path).train()
    path = tmp_path / store.MANIFEST_NAME
    data = json.loads(path.read_text())
    data["entries"][-1]["digest"] = "xxh3-128-tree:" + "f" * 32  # the file no longer matches
    path.write_text(json.dumps(data))
    latest = tmp_path / read_manifest(tmp_path)[-1].file
    with pytest.raises(CheckpointCorrupt) as exc:
        Nitro(KeepLast(), run_dir=tmp_path, resume="auto")
    assert str(latest) in str(exc.value)
    assert "the manifest recorded xxh3-128-tree:ffffffffffffffff..." in str(exc.value)


def test_an_export_from_a_pair_without_run_dir_says_what_to_write(tmp_path):
    with pytest.raises(ConfigError) as exc:
        export_weights("latest => best", tmp_path / "w.safetensors")
    assert str(exc.value) == (
        "export_weights('latest => best', ...) needs run_dir= to find the run; write "
        "export_weights('latest => best', path, run_dir='runs/MyExp')."
    )
    assert not (tmp_path / "w.safetensors").exists()
