"""The run store's rules that differ by medium, checked in-process against a real S3 server
and a disk: where a record may be named when killed writes left objects under its names,
and that one call model (``open_run``, ``place``) reads a name the same way everywhere."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from nitro_core import Checkpointer, Last, TrainingRefused
from nitro_core.store.place import LocalPlace, ObjectPlace, place
from nitro_core.store.run import LocalRun, ObjectRun, open_run
from nitro_core.training.checkpointing import RecordWriter
from nitro_core.training.distributed import Dist
from nitro_core.training.sharded_save import RecordDirectory
from tests.s3_server import client_for


@pytest.fixture
def url(s3_endpoint, monkeypatch):
    client = client_for(s3_endpoint, monkeypatch, "nitro-run-store")
    prefix = f"t-{uuid.uuid4().hex[:10]}/run"
    return client, f"s3://nitro-run-store/{prefix}", prefix


def _writer(store) -> RecordWriter:
    fmt = RecordDirectory(Dist(), False, store, "r1")
    return RecordWriter(store, Checkpointer(keep=Last(2)), "r1", ("loss", "min"), None, Dist(), fmt)


def _plant(client, prefix: str, names: list[str]) -> None:
    """What killed record-directory uploads leave: objects under each name's prefix."""
    for name in names:
        client.put_object(Bucket="nitro-run-store", Key=f"{prefix}/{name}/0.safetensors", Body=b"x")


def test_a_record_directory_on_s3_takes_a_spare_name_past_killed_uploads(
    url, tmp_path, monkeypatch
):
    monkeypatch.setenv("NITRO_STAGING", str(tmp_path / "staging"))
    client, where, prefix = url
    _plant(client, prefix, ["epoch-0001-step-4", "epoch-0001-step-4-run-r1"])
    claim = _writer(ObjectRun.at(where, "run_dir"))._claim("epoch-0001-step-4", [])
    assert claim.path.name == "epoch-0001-step-4-run-r1-1"


def test_every_name_held_by_leftovers_is_refused_saying_what_to_delete(url, tmp_path, monkeypatch):
    monkeypatch.setenv("NITRO_STAGING", str(tmp_path / "staging"))
    client, where, prefix = url
    names = ["epoch-0001-step-4", "epoch-0001-step-4-run-r1"]
    names += [f"epoch-0001-step-4-run-r1-{k}" for k in range(1, 8)]
    _plant(client, prefix, names)
    with pytest.raises(TrainingRefused) as refused:
        _writer(ObjectRun.at(where, "run_dir"))._claim("epoch-0001-step-4", [])
    assert (
        f"Run r1 cannot write 'epoch-0001-step-4' in '{where}': objects lie under each of the 9 names tried"
        in str(refused.value)
    )
    assert f"(nitro verify {where} names them)" in str(refused.value)


def test_a_disk_tries_the_name_and_its_run_suffixed_form_only(tmp_path):
    (tmp_path / "epoch-0001-step-4").mkdir()
    (tmp_path / "epoch-0001-step-4-run-r1").mkdir()
    with pytest.raises(TrainingRefused) as refused:
        _writer(LocalRun(tmp_path))._claim("epoch-0001-step-4", [])
    assert "the name and its run-suffixed form are taken by unlisted files" in str(refused.value)


def test_a_name_decides_its_medium_in_one_place(tmp_path):
    assert isinstance(open_run("s3://bucket-a/runs/x"), ObjectRun)
    assert isinstance(open_run(tmp_path), LocalRun)
    assert open_run("s3://bucket-a/runs/x/") == open_run("s3://bucket-a/runs/x")  # parsed
    assert str(open_run("s3://bucket-a/runs/x")) == "s3://bucket-a/runs/x"
    assert isinstance(place("s3://bucket-a/runs/x/a.safetensors"), ObjectPlace)
    assert isinstance(place(str(tmp_path / "a.safetensors")), LocalPlace)
    with pytest.raises(Exception, match="gs:// is not a storage Nitro writes to"):
        open_run("gs://bucket-a/runs/x")


def test_places_compare_as_parsed_and_resolved(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "run")
    assert place(str(tmp_path / "link")).same(place(str(tmp_path / "run")))
    assert not place(str(tmp_path / "run")).same(place("s3://bucket-a/run"))
    assert place("s3://bucket-a/run/").same(place("s3://bucket-a/run"))
    run = place("s3://bucket-a/run")
    assert run.holds("s3://bucket-a/run/epoch-1.safetensors", (tmp_path,))
    assert not run.holds("s3://bucket-a/other/epoch-1.safetensors", (tmp_path,))
    assert not run.holds("gs://bucket-a/run/epoch-1.safetensors", (tmp_path,))
    local = place(str(tmp_path / "run"))
    assert local.holds("run/epoch-1.safetensors", (tmp_path,))
    assert not local.holds("other/epoch-1.safetensors", (tmp_path,))
    assert not local.holds("s3://bucket-a/run/epoch-1.safetensors", (tmp_path,))
    assert local.shown_from(tmp_path) == "run" and run.shown_from(tmp_path) == "s3://bucket-a/run"
    assert Path(str(local)) == tmp_path / "run"


def test_a_refused_resume_on_s3_names_the_record_s_url_never_its_staging_copy(
    url, tmp_path, monkeypatch
):
    from nitro_core import Nitro, ResumeRefused, read_manifest
    from nitro_core.examples import Regression

    monkeypatch.setenv("NITRO_STAGING", str(tmp_path / "staging"))
    _, where, _ = url
    Nitro(Regression(max_epochs=1, samples=64), run_dir=where).train().close()
    last = f"{where}/{read_manifest(where)[-1].file}"
    with pytest.raises(ResumeRefused) as raised:  # a plain field changed: refused with a diff
        Nitro(Regression(max_epochs=2, samples=64, hidden=16), run_dir=where, resume="auto")
    said = str(raised.value)
    assert said.startswith(f"Cannot resume {last!r}: the config changed"), said
    assert str(tmp_path / "staging") not in said
