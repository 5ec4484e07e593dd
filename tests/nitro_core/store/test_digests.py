"""A record carries a digest per section, and each reader verifies exactly the sections it
reads: a byte flipped in any section of a real record is caught, with the same message, by
every reader of that section and by no reader that skips it (averaging never reads the
optimizer state); ``verify`` catches it wherever it is. Records written before sections (a
fixture kept from that format) still load, average and verify."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from nitro_core import (
    CheckpointCorrupt,
    Checkpointer,
    Last,
    Nitro,
    average_checkpoints,
    checkpoint_info,
    read_manifest,
    verify,
)
from nitro_core.examples import Classifier
from nitro_core.store import recordio as store
from nitro_core.store.section_check import SectionCheck

from .. import by_hand

FIXTURE = Path(__file__).parents[1] / "fixtures" / "before_sections"


class KeepTwo(Classifier):
    """Parameters, layer state (BatchNorm), AdamW state, an EMA and RNG state: every section."""

    def checkpointer(self):
        return Checkpointer(keep=Last(2))


EXP = {"max_epochs": 2, "samples": 64}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("trained") / "run"
    Nitro(KeepTwo(**EXP), run_dir=d).train().logger.close()
    return d


@pytest.fixture
def run(trained, tmp_path) -> Path:
    d = tmp_path / "run"
    shutil.copytree(trained, d)
    return d


def flip(path: Path, section: str) -> None:
    """Flip one bit in the middle of the first tensor of ``section``."""
    begin, end = by_hand.section_range(path, section)
    raw = bytearray(path.read_bytes())
    raw[(begin + end) // 2] ^= 0x04
    path.write_bytes(bytes(raw))


def refusal(path: Path, section: str) -> str:
    actual = by_hand.sections(path)[section]
    recorded = checkpoint_info(path)["integrity"]["sections"][section]
    return (
        f"Checkpoint {str(path)!r} is corrupt: its {section!r} section digests to "
        f"xxh3-128:{actual[:16]}..., its header recorded xxh3-128:{recorded[:16]}... when it "
        "was written. Load another checkpoint or restore this file from a backup."
    )


def readers(d: Path) -> dict:
    return {
        "average": lambda: average_checkpoints(d, "latest => Average(Last(2))"),
        "weights": lambda: Nitro(KeepTwo(**EXP), run_dir=d / "new", weights=str(d / "x")),
        "resume": lambda: Nitro(KeepTwo(**{**EXP, "max_epochs": 3}), run_dir=d, resume="auto"),
        "checkpoint_info": lambda: checkpoint_info(d / "x"),
    }


# section -> the readers that read it (and so must refuse it); the others must not notice
READ_BY = {
    "params": {"average", "weights", "resume"},
    "buffers": {"average", "weights", "resume"},  # the latest record supplies the layer state
    "ema": {"average", "weights", "resume"},
    "optim": {"resume"},
    "rng": {"resume"},
}


def test_a_record_has_one_digest_per_section(trained):
    path = trained / read_manifest(trained)[-1].file
    block = checkpoint_info(path)["integrity"]
    assert set(block["sections"]) == set(READ_BY)
    assert block == by_hand.integrity(path)


@pytest.mark.parametrize("section", sorted(READ_BY))
def test_a_flipped_byte_in_each_section_is_caught_by_exactly_its_readers(run, section):
    latest = run / read_manifest(run)[-1].file
    flip(latest, section)
    expected = refusal(latest, section)
    calls = readers(run)
    calls["weights"] = lambda: Nitro(KeepTwo(**EXP), run_dir=run / "new", weights=str(latest))
    calls["checkpoint_info"] = lambda: checkpoint_info(latest)
    for name, call in calls.items():
        if name in READ_BY[section]:
            with pytest.raises(CheckpointCorrupt) as exc:
                call()
            assert str(exc.value) == expected, name
        else:
            result = call()  # reads nothing of that section: nothing to notice
            if isinstance(result, Nitro):
                result.logger.close()
    (checked,) = [c for c in verify(run) if c.file == latest.name]
    assert (checked.ok, checked.problem) == (False, expected)
    assert [c.ok for c in verify(run) if c.file != latest.name] == [True]


def test_a_changed_header_is_caught_by_every_reader_of_a_listed_record(run):
    entry = read_manifest(run)[-1]
    latest = run / entry.file
    raw = latest.read_bytes()
    assert raw.count(b'\\"seed\\":0') == 1
    latest.write_bytes(raw.replace(b'\\"seed\\":0', b'\\"seed\\":1'))
    actual = by_hand.tree(latest)
    expected = (
        f"Checkpoint {str(latest)!r} is corrupt: its header digests to {actual[:30]}..., the "
        f"manifest recorded {entry.digest[:30]}... when it was written. Load another checkpoint "
        "(read_manifest lists them) or restore this file from a backup."
    )
    calls = readers(run)
    calls["weights"] = lambda: Nitro(KeepTwo(**EXP), run_dir=run, weights="latest => latest")
    del calls["checkpoint_info"]  # the header alone, unchecked: it reads no manifest
    for name, call in calls.items():
        with pytest.raises(CheckpointCorrupt) as exc:
            call()
        assert str(exc.value) == expected, name
    assert [c.problem for c in verify(run) if not c.ok] == [expected]


def test_a_weights_load_and_an_average_never_read_the_optimizer_bytes(run, monkeypatch):
    hashed: list[str] = []
    real = SectionCheck.hash

    def spy(self, sums, t, view):
        hashed.append(t.section)
        return real(self, sums, t, view)

    monkeypatch.setattr(SectionCheck, "hash", spy)
    average_checkpoints(run, "latest => Average(Last(2))")
    assert set(hashed) == {"params", "ema", "buffers"}
    hashed.clear()
    Nitro(KeepTwo(**EXP), run_dir=run, weights="latest => latest").logger.close()
    assert set(hashed) == {"params", "ema", "buffers"}


# -- records written before sections ---------------------------------------------------------------
@pytest.fixture
def old(tmp_path) -> Path:
    d = tmp_path / "old"
    shutil.copytree(FIXTURE, d)
    return d


def test_records_written_before_sections_load_average_and_verify(old):
    entries = read_manifest(old)
    assert [e.digest for e in entries] == [None] * 3 and all(e.sha256 for e in entries)
    paths = [old / e.file for e in entries]
    assert all("tensor_digest" in checkpoint_info(p) for p in paths)
    result = average_checkpoints(old, "latest => Average(Last(3))")
    for key in ("0.weight", "4.bias"):
        total = None
        for p in paths:
            with safe_open(str(p), framework="pt") as f:
                t = f.get_tensor(f"params/{key}").to(torch.float64)
            total = t if total is None else total + t
        assert torch.equal(result.state[key], (total / 3).to(torch.float32)), key
    with safe_open(str(paths[-1]), framework="pt") as f:
        mean = f.get_tensor("buffers/1.running_mean")
    assert torch.equal(result.state["1.running_mean"], mean)  # layer state: the latest's
    w = Nitro(Classifier(max_epochs=3, samples=64, hidden=8), run_dir=old / "new",
              weights=str(paths[-1]))  # fmt: skip
    w.logger.close()
    assert torch.equal(w.model.state_dict()["1.running_mean"], mean)
    assert [(c.file, c.ok, c.listed) for c in verify(old)] == [
        (e.file, True, True) for e in entries
    ]


def test_a_flip_in_a_record_written_before_sections_is_caught_by_its_old_digests(old):
    entry = read_manifest(old)[-1]
    path = old / entry.file
    flip(path, "optim")
    actual = store.file_sha256(path)
    with pytest.raises(CheckpointCorrupt) as exc:
        store.read_record(path, entry.expected)  # listed: the manifest's sha256, every byte
    assert str(exc.value) == (
        f"Checkpoint {str(path)!r} is corrupt: its sha256 is {actual[:16]}..., the manifest "
        f"recorded {entry.sha256[:16]}... when it was written. Load another checkpoint "
        "(read_manifest lists them) or restore this file from a backup."
    )
    recorded = checkpoint_info(path)["tensor_digest"]
    with pytest.raises(CheckpointCorrupt) as exc:
        store.read_record(path, sections={"params"})  # unlisted: the header's tensor digest
    assert str(exc.value).startswith(
        f"Checkpoint {str(path)!r} is corrupt: its tensor bytes digest to sha256-8MiB-blocks:"
    )
    assert f"its header recorded {recorded[:35]}..." in str(exc.value)
    with pytest.raises(CheckpointCorrupt):
        average_checkpoints(old, "latest => Average(Last(3))")  # an old record is hashed whole
    assert [c.ok for c in verify(old)] == [True, True, False]


@pytest.mark.parametrize("threads", [1, 2])
def test_averaging_hashes_beside_the_sum_when_a_core_is_spare_and_still_catches_a_flip(
    run, threads, monkeypatch
):
    from nitro_core.store import digest

    hashed_on: set[str] = set()  # the threads that hashed the averaged sections
    real = digest.Sections.update

    def update(self, section, view):
        if section in ("params", "ema"):
            hashed_on.add(threading.current_thread().name.split("_")[0])
        return real(self, section, view)

    monkeypatch.setattr(digest.Sections, "update", update)
    was = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        average_checkpoints(run, "latest => Average(Last(2))")
        assert hashed_on == ({"nitro-hash"} if threads > 1 else {"MainThread"})
        latest = run / read_manifest(run)[-1].file
        flip(latest, "params")
        with pytest.raises(CheckpointCorrupt) as exc:
            average_checkpoints(run, "latest => Average(Last(2))")
        assert str(exc.value) == refusal(latest, "params")
    finally:
        torch.set_num_threads(was)


def test_a_stream_yields_a_piece_only_once_the_thread_has_read_and_hashed_it(run, monkeypatch):
    from nitro_core.store import digest

    expected = average_checkpoints(run, "latest => Average(Last(2))").state
    real = digest.Sections.update

    def slow(self, section, view):
        time.sleep(0.005)  # a reading thread that lags behind the sum
        return real(self, section, view)

    monkeypatch.setattr(digest.Sections, "update", slow)
    was = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        state = average_checkpoints(run, "latest => Average(Last(2))").state
    finally:
        torch.set_num_threads(was)
    assert state.keys() == expected.keys()
    assert all(torch.equal(state[k], expected[k]) for k in state)


@pytest.mark.parametrize("kind", ["sections", "whole file (before sections)"])
def test_a_stream_closed_early_leaves_the_next_pass_over_the_record_correct(
    trained, kind, monkeypatch
):
    from concurrent.futures import ThreadPoolExecutor

    from nitro_core.store import reader

    d = trained if kind == "sections" else FIXTURE
    entry = read_manifest(d)[-1]
    real = SectionCheck.hash

    def slow(self, sums, t, view):
        time.sleep(0.05)  # the job for the next piece is still running when the stream closes
        return real(self, sums, t, view)

    monkeypatch.setattr(SectionCheck, "hash", slow)
    with ThreadPoolExecutor(1) as pool, reader.RecordFile(d / entry.file, entry.expected) as r:
        first = r.stream(piece_bytes=64, hasher=pool)
        next(first)
        first.close()  # a consumer that stopped after one piece
        assert sum(1 for _ in r.stream(piece_bytes=4096, hasher=pool)) > 0  # verified whole
