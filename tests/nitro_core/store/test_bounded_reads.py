"""Every read of a manifest, journal, index, header or job file is bounded by its size
before a byte is read (fstat on disk, the object's length on S3), and refused naming the
limit; the files an ``hf:`` directory names are opened without following a link, and its
index is bounded in size and depth (DESIGN section 16). Oversized files are sparse here:
their size is real, their bytes cost nothing."""

from __future__ import annotations

import json

import boto3
import pytest
import torch
from safetensors.torch import save_file

from nitro_core import read_manifest
from nitro_core.errors import CheckpointMissing, RecordError, UnsafePath
from nitro_core.jobs.files import read_status
from nitro_core.store import hf, journal
from nitro_core.store.safeio import READ_LIMITS
from nitro_core.store.shard_header import header_bytes
from tests.s3_server import settings

OVER = 4096  # bytes past a limit: a read of limit + 1 bytes would report less


def _sparse(path, size):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)


def _limit_text(what):
    limit = READ_LIMITS[what]
    return f"over the {limit} bytes ({limit // 2**20} MiB) Nitro reads of a {what}"


@pytest.mark.parametrize(
    ("what", "name", "read"),
    [
        ("manifest", "run/manifest.json", lambda tmp: read_manifest(tmp / "run")),
        ("journal", f"run/{journal.NAME}", lambda tmp: read_manifest(tmp / "run")),
        ("job file", ".nitro/jobs/j1/status.json", lambda tmp: read_status(tmp / ".nitro/jobs/j1")),
        ("record header", "run/rec/header.json", lambda tmp: header_bytes(tmp / "run/rec")),
        ("safetensors index", f"models/x/{hf.INDEX}",
         lambda tmp: hf.weight_files(tmp / "models/x", "hf:models/x")),
    ],
)  # fmt: skip
def test_a_file_over_its_limit_is_refused_before_it_is_read(tmp_path, what, name, read):
    _sparse(tmp_path / name, READ_LIMITS[what] + OVER)
    with pytest.raises(RecordError) as caught:
        read(tmp_path)
    text = str(caught.value)
    assert f"Refusing to read the {what} " in text and _limit_text(what) in text, text
    assert f"it is {READ_LIMITS[what] + OVER} bytes" in text  # its size, before any read
    assert text.endswith("Move it aside (or restore it from a backup) and call again.")


def test_a_manifest_object_over_its_limit_is_refused_by_its_length(s3_endpoint, monkeypatch):
    for k, v in settings(s3_endpoint).items():
        monkeypatch.setenv(k, v)
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    try:
        client.create_bucket(Bucket="nitro-bounds")
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    size = READ_LIMITS["manifest"] + OVER
    client.put_object(Bucket="nitro-bounds", Key="big/run/manifest.json", Body=b" " * size)
    with pytest.raises(RecordError) as caught:
        read_manifest("s3://nitro-bounds/big/run")
    assert "'s3://nitro-bounds/big/run/manifest.json'" in str(caught.value)
    assert _limit_text("manifest") in str(caught.value)
    assert f"it is {size} bytes" in str(caught.value)  # its length, before its body is read


def _shard(path, value=1.0):
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"w": torch.full((2,), value)}, str(path))


@pytest.mark.parametrize("name", [hf.SINGLE, "model-00001-of-00001.safetensors", hf.INDEX])
def test_a_linked_file_in_an_hf_directory_is_refused_naming_what_to_do(tmp_path, name):
    outside = tmp_path / "outside"
    _shard(outside / "w.safetensors", 7.0)
    (outside / "index.json").write_text(
        json.dumps({"weight_map": {"w": "model-00001-of-00001.safetensors"}})
    )
    d = tmp_path / "root" / "models" / "x"
    d.mkdir(parents=True)
    if name == "model-00001-of-00001.safetensors":
        (d / hf.INDEX).write_text(json.dumps({"weight_map": {"w": name}}))
        (d / name).symlink_to(outside / "w.safetensors")
    elif name == hf.INDEX:
        (d / name).symlink_to(outside / "index.json")
    else:
        (d / name).symlink_to(outside / "w.safetensors")
    with pytest.raises(UnsafePath) as caught:
        hf.read_dir(d, "hf:models/x")
    assert str(caught.value) == (
        f"Source 'hf:models/x': {str(d / name)!r} is a symbolic link, and Nitro never follows a "
        "link for a file of an hf: directory (it could lead outside the server's root). Copy "
        "the real file into the directory in its place (cp --remove-destination --dereference), "
        "or export the model there again."
    )


def test_a_linked_provenance_file_is_refused_too(tmp_path):
    d = tmp_path / "x"
    _shard(d / hf.SINGLE)
    (tmp_path / "p.json").write_text("{}")
    (d / hf.PROVENANCE).symlink_to(tmp_path / "p.json")
    with pytest.raises(UnsafePath):
        hf.read_dir(d, "hf:x")


def test_a_real_hf_directory_still_loads(tmp_path):
    d = tmp_path / "x"
    _shard(d / "model-00001-of-00001.safetensors", 3.0)
    (d / hf.INDEX).write_text(json.dumps({"weight_map": {"w": "model-00001-of-00001.safetensors"}}))
    tensors, provenance = hf.read_dir(d, "hf:x")
    assert torch.equal(tensors["w"], torch.full((2,), 3.0)) and provenance == {}


def test_an_index_nested_200000_deep_is_refused_clearly(tmp_path):
    d = tmp_path / "x"
    d.mkdir()
    (d / hf.INDEX).write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(RecordError) as caught:
        hf.weight_files(d, "hf:x")
    assert str(caught.value).startswith(
        f"Source 'hf:x': {str(d / hf.INDEX)!r} is not a safetensors index (its JSON nests "
        "deeper than Python parses); it must hold "
    )


def test_an_index_entry_outside_the_directory_is_refused(tmp_path):
    d = tmp_path / "x"
    _shard(tmp_path / "w.safetensors")
    d.mkdir()
    (d / hf.INDEX).write_text(json.dumps({"weight_map": {"w": "../w.safetensors"}}))
    with pytest.raises(RecordError) as caught:
        hf.weight_files(d, "hf:x")
    assert str(caught.value) == (
        f"Source 'hf:x': {str(d / hf.INDEX)!r} maps 'w' to '../w.safetensors', not a "
        ".safetensors file in that directory. Write the index again with save_pretrained() "
        "or export_hf()."
    )


def test_an_index_key_its_shard_lacks_is_refused(tmp_path):
    d = tmp_path / "x"
    _shard(d / "model-00001-of-00001.safetensors")
    (d / hf.INDEX).write_text(
        json.dumps(
            {
                "weight_map": {
                    "w": "model-00001-of-00001.safetensors",
                    "v": "model-00001-of-00001.safetensors",
                }
            }
        )  # fmt: skip
    )
    with pytest.raises(CheckpointMissing) as caught:
        hf.read_dir(d, "hf:x")
    assert str(caught.value) == (
        "Source 'hf:x': the index names ['v'] in 'model-00001-of-00001.safetensors', which "
        "does not hold them. Export the directory again."
    )


def test_an_index_naming_a_missing_shard_is_refused(tmp_path):
    d = tmp_path / "x"
    d.mkdir()
    (d / hf.INDEX).write_text(json.dumps({"weight_map": {"w": "model-1.safetensors"}}))
    with pytest.raises(CheckpointMissing, match="names the shard 'model-1.safetensors', which"):
        hf.weight_files(d, "hf:x")
