"""The one record writer (:class:`nitro_core.training.checkpointing.RecordWriter`) does the
same for both record formats, a file and a record directory (the FSDP format, written here
by one process through DCP): the entry, the ``-run-<id>`` name, retention, and the drain
that compacts the journal."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from nitro_core import Checkpointer, Last, Nitro, read_manifest
from nitro_core.store import journal, manifest
from nitro_core.store import recordio as store
from nitro_core.store.run import LocalRun
from nitro_core.training import snapshot
from nitro_core.training.checkpointing import OneFile, RecordFormat, RecordWriter
from nitro_core.training.distributed import Dist
from nitro_core.training.sharded_save import RecordDirectory

from ..tiny import Tiny


def formats(name: str, run: LocalRun) -> RecordFormat:
    return OneFile(async_write=False) if name == "file" else RecordDirectory(Dist(), False, run)


def writer(run_dir: Path, run: str, name: str) -> RecordWriter:
    ckpt = Checkpointer(keep=Last(2), async_write=False)
    where = LocalRun(run_dir)
    return RecordWriter(where, ckpt, run, ("loss", "min"), None, Dist(), formats(name, where))


@pytest.fixture(scope="module")
def handle(tmp_path_factory: pytest.TempPathFactory) -> Nitro:
    """A handle whose state the writers record (its own checkpointer is not used)."""
    return Nitro(Tiny(max_epochs=1), run_dir=tmp_path_factory.mktemp("src")).train()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
@pytest.mark.parametrize("name", ["file", "directory"])
def test_either_format_is_named_kept_and_compacted_by_the_one_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handle: Nitro, name: str
) -> None:
    monkeypatch.setattr(manifest, "SMALL", 0)  # every manifest counts as large: a journal
    snap = functools.partial(snapshot.take, handle)
    other = writer(tmp_path, "0000aaaa", name)
    other.save(1, 4, 0.5, None, snap)  # another run's record, under the same name
    other.drain()
    mine = writer(tmp_path, "1111bbbb", name)
    suffix = ".safetensors" if name == "file" else ""
    first = mine.save(1, 4, 0.5, None, snap)
    assert first is not None and first.file == f"epoch-0001-step-4-loss=0.5-run-1111bbbb{suffix}"
    for epoch in (2, 3):
        mine.save(epoch, 4 * epoch, 0.5, None, snap)
    assert (tmp_path / journal.NAME).exists()  # the run's changes are journal lines
    mine.drain()
    assert not (tmp_path / journal.NAME).exists()  # manifest.json alone lists every record
    assert [(e.run, e.file) for e in read_manifest(tmp_path)] == [
        ("0000aaaa", f"epoch-0001-step-4-loss=0.5{suffix}"),
        ("1111bbbb", f"epoch-0002-step-8-loss=0.5{suffix}"),
        ("1111bbbb", f"epoch-0003-step-12-loss=0.5{suffix}"),
    ]  # Last(2) dropped run 1111bbbb's epoch 1, and its file
    assert not (tmp_path / first.file).exists()
    for e in read_manifest(tmp_path):
        assert store.read_header(tmp_path / e.file)["run"] == handle.run_id  # the snapshot's
