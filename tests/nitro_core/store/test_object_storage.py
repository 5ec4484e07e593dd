"""Run directories on S3-compatible object storage, against real S3 servers the tests start
on 127.0.0.1 (SeaweedFS and moto: tests/s3_server.py) and stop by pid: the protocol's tests
run in the default suite, on both, the kills, the CLI and the full read-back in the slow
one, on SeaweedFS.

The manifest object is the only commit point: records are objects uploaded whole under
fresh names, listed by a conditional replace of the manifest; an object the manifest does
not list is never read as a record; retention deletes only what a committed manifest no
longer lists; two processes committing at once lose nothing and duplicate nothing."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import boto3
import pytest
import torch
from safetensors.torch import load_file

from nitro_core import (
    CheckpointCorrupt,
    Checkpointer,
    CheckpointMissing,
    CheckpointNotFound,
    ConfigError,
    Last,
    Nitro,
    TrainingRefused,
    average_checkpoints,
    checkpoint_info,
    delete_checkpoints,
    experiment_from_record,
    export_weights,
    read_manifest,
    runs,
    verify,
)
from nitro_core.policy import retention
from nitro_core.store import object_run, objects
from nitro_core.store.run import open_run
from nitro_core.transfer import push
from tests.nitro_core.tiny import KeepLast, Tiny
from tests.s3_server import settings

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def endpoint(s3_endpoint):
    return s3_endpoint


@pytest.fixture
def s3(endpoint, monkeypatch):
    """This process's AWS settings naming the server; the client and the test's bucket (one
    for the module: SeaweedFS gives each bucket volumes of its own)."""
    for k, v in settings(endpoint).items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    try:
        client.create_bucket(Bucket="nitro-tests")
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass  # an earlier test made it
    return client, "nitro-tests"


@pytest.fixture
def prefix():
    """A prefix no other test uses."""
    return f"t-{uuid.uuid4().hex[:10]}"


def pushed_run(tmp_path: Path, url: str, epochs: int) -> Path:
    """A run trained on disk for ``epochs`` and pushed to ``url``; its local directory."""
    local = tmp_path / "run"
    trained(local, epochs=epochs)
    push(local, url)
    return local


class KeepMany(Tiny):
    def checkpointer(self):
        return Checkpointer(keep=Last(20))


def killed_unless_done(command: list[str], env: dict[str, str], after_s: float) -> None:
    """Run ``command``; SIGKILL it ``after_s`` seconds in, unless it ended first."""
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        child.wait(timeout=after_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def keys(client, bucket: str, prefix: str) -> set[str]:
    r = client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
    return {o["Key"].removeprefix(prefix + "/") for o in r.get("Contents", ())}


def trained(run: Path, experiment=Tiny, epochs: int = 3) -> Nitro:
    n = Nitro(experiment(max_epochs=epochs), run_dir=run, resume=False)
    n.train()
    return n


@pytest.mark.slow  # subprocesses, or many trials
def test_a_pushed_run_reads_back_as_on_disk(s3, tmp_path, prefix):
    client, bucket = s3
    local = tmp_path / "run"
    trained(local)
    url = f"s3://{bucket}/{prefix}/run"
    pushed = push(local, url)
    on_disk = read_manifest(local)
    there = read_manifest(url)
    assert [(e.file, e.digest, e.bytes, e.step) for e in there] == [
        (e.file, e.digest, e.bytes, e.step) for e in on_disk
    ]
    assert [e.file for e in pushed] == [e.file for e in on_disk]
    assert runs(url) == runs(local)
    assert keys(client, bucket, f"{prefix}/run") == {"manifest.json"} | {e.file for e in on_disk}
    for e in on_disk:  # the header from ranged reads, checked against the manifest
        assert checkpoint_info(f"{url}/{e.file}") == checkpoint_info(local / e.file)
    checked = verify(url)
    assert [(c.file, c.ok, c.listed, c.bytes) for c in checked] == [
        (e.file, True, True, e.bytes) for e in on_disk
    ]
    assert push(local, url) == []  # again: nothing listed twice
    assert len(read_manifest(url)) == len(on_disk)


def test_a_push_lists_nothing_twice_when_a_killed_push_commit_lands_after_it_read(
    s3, tmp_path, prefix, monkeypatch
):
    client, bucket = s3
    local = tmp_path / "run"
    trained(local, epochs=2)
    url = f"s3://{bucket}/{prefix}/run"
    push(local, url)  # the killed push: its commits landed whole, late
    before = keys(client, bucket, f"{prefix}/run")
    with monkeypatch.context() as m:  # the next push read the manifest before they landed
        m.setattr(object_run, "read_manifest", lambda run: [])
        assert push(local, url) == []  # each record sent again, then found listed by the commit
    on_disk = read_manifest(local)
    assert [(e.file, e.digest) for e in read_manifest(url)] == [(e.file, e.digest) for e in on_disk]
    assert keys(client, bucket, f"{prefix}/run") == before  # the second copies deleted


def last_two(e):
    """Retention under Last(2) for the run of ``e``: what the files it unlists are."""
    ckpt = Checkpointer(keep=Last(2))
    return lambda entries: set(retention.plan(entries, ckpt, e.run, e.pair).delete)


def test_retention_on_s3_deletes_exactly_what_it_deletes_on_disk(s3, tmp_path, prefix):
    client, bucket = s3
    everything, kept = tmp_path / "all", tmp_path / "kept"
    trained(everything, KeepMany, epochs=4)  # every record, on disk
    trained(kept, KeepLast, epochs=4)  # the same run under Last(2), on disk
    url = objects.parse(f"s3://{bucket}/{prefix}")
    seen = []
    for e in read_manifest(everything):  # offered one by one under Last(2)
        object_run.publish(url, everything / e.file, e, last_two(e))
        seen.append(e.file)
        listed = [x.file for x in read_manifest(str(url))]
        assert listed == seen[-2:]
        assert keys(client, bucket, prefix) == {"manifest.json", *listed}  # the rest deleted
    assert [e.file for e in read_manifest(str(url))] == [e.file for e in read_manifest(kept)]


def test_an_object_the_manifest_does_not_list_is_never_read_as_a_record(s3, tmp_path, prefix):
    client, bucket = s3
    local = tmp_path / "run"
    trained(local, epochs=1)
    url = f"s3://{bucket}/{prefix}"
    (entry,) = read_manifest(local)
    # a killed writer's upload, under the very name the record is about to take
    client.put_object(Bucket=bucket, Key=f"{prefix}/{entry.file}", Body=b"half a record")
    (pushed,) = push(local, url)
    stem = entry.file.removesuffix(".safetensors")
    assert pushed.file == f"{stem}-run-{entry.run}.safetensors"  # the orphan's name not reused
    orphan = client.get_object(Bucket=bucket, Key=f"{prefix}/{entry.file}")["Body"].read()
    assert orphan == b"half a record"  # never overwritten
    with pytest.raises(CheckpointMissing) as e:
        checkpoint_info(f"{url}/{entry.file}")
    assert f"'{url}/{entry.file}' is not a record the manifest of '{url}' lists" in str(e.value)
    assert f"Listed: {pushed.file!r}" in str(e.value)
    with pytest.raises(CheckpointMissing, match="is not a record the manifest"):
        verify(f"{url}/{entry.file}")
    assert [(c.file, c.ok) for c in verify(url)] == [(pushed.file, True)]  # listed ones only
    assert checkpoint_info(f"{url}/{pushed.file}")["step"] == entry.step


def test_a_manifest_edited_to_list_a_missing_object_is_refused_clearly(s3, tmp_path, prefix):
    client, bucket = s3
    url = f"s3://{bucket}/{prefix}"
    pushed_run(tmp_path, url, epochs=2)
    first, second = read_manifest(url)
    client.delete_object(Bucket=bucket, Key=f"{prefix}/{first.file}")  # by hand, behind its back
    with pytest.raises(CheckpointMissing) as e:
        checkpoint_info(f"{url}/{first.file}")
    assert f"'{url}/{first.file}' is listed by its manifest but the object is gone" in str(e.value)
    checked = verify(url)
    assert [(c.file, c.ok) for c in checked] == [(first.file, False), (second.file, True)]
    assert "the object is gone" in checked[0].problem


def test_bytes_changed_on_the_server_are_found(s3, tmp_path, prefix):
    client, bucket = s3
    url = f"s3://{bucket}/{prefix}"
    local = pushed_run(tmp_path, url, epochs=1)
    (entry,) = read_manifest(url)
    body = bytearray((local / entry.file).read_bytes())
    body[-3] ^= 0xFF  # a tensor byte
    client.put_object(Bucket=bucket, Key=f"{prefix}/{entry.file}", Body=bytes(body))
    (checked,) = verify(url)
    assert not checked.ok and "corrupt" in checked.problem
    assert f"{url}/{entry.file}" in checked.problem  # named by its URL, not a temporary copy
    head = bytearray((local / entry.file).read_bytes())
    head[40] ^= 0x01  # a header byte
    client.put_object(Bucket=bucket, Key=f"{prefix}/{entry.file}", Body=bytes(head))
    with pytest.raises(CheckpointCorrupt, match="its header digests to"):
        checkpoint_info(f"{url}/{entry.file}")


RACER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from nitro_core import read_manifest
    from nitro_core.store import object_run, objects

    local, url, tag, other, rounds, gate = (
        Path(sys.argv[1]), objects.parse(sys.argv[2]), sys.argv[3], sys.argv[4],
        int(sys.argv[5]), Path(sys.argv[6]),
    )
    lost = 0  # conditional writes refused: races this writer lost (it re-read and retried)

    def counted(write):
        def call(*args):
            global lost
            done = write(*args)
            lost += done is None
            return done
        return call

    objects.Bucket.create = counted(objects.Bucket.create)
    objects.Bucket.replace = counted(objects.Bucket.replace)
    (entry,) = read_manifest(local)
    for i in range(rounds):  # each round: both writers commit at the same moment
        (gate / f"{tag}{i}").touch()
        while not (gate / f"{other}{i}").exists():
            time.sleep(0.001)
        mine = entry.model_copy(update={"run": f"{tag}{i:03d}", "step": i + 1})
        object_run.publish(url, local / entry.file, mine, None)
    print(lost)
    """
)


def test_two_processes_committing_at_once_lose_nothing_and_list_nothing_twice(s3, tmp_path, prefix):
    """50 rounds; in each, two processes commit a record to one S3 run directory at the
    same moment (each waits for the other at a file gate), so the manifest's conditional
    replace decides between them."""
    client, bucket = s3
    local = tmp_path / "run"
    trained(local, epochs=1)
    gate = tmp_path / "gate"
    gate.mkdir()
    url = f"s3://{bucket}/{prefix}"
    rounds = 50
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(local), url, tag, other, str(rounds), str(gate)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for tag, other in (("a", "b"), ("b", "a"))
    ]
    lost = [int(p.communicate(timeout=600)[0]) for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert sum(lost) > 0, "the writers never raced: the test exercised no lost race"
    entries = read_manifest(url)
    ids = sorted(e.run for e in entries)
    assert ids == sorted(f"{t}{i:03d}" for t in "ab" for i in range(rounds))  # none lost
    files = [e.file for e in entries]
    assert len(set(files)) == len(files) == 2 * rounds  # no name listed twice
    assert keys(client, bucket, prefix) == {"manifest.json", *files}  # every upload listed
    doc = json.loads(client.get_object(Bucket=bucket, Key=f"{prefix}/manifest.json")["Body"].read())
    assert sorted(doc["points"]) == ids  # each run's point committed with its record


def test_bad_storage_input_is_refused_with_what_to_write(s3, tmp_path, prefix, monkeypatch):
    client, bucket = s3
    with pytest.raises(ConfigError) as e:
        read_manifest("gs://bucket/run")
    assert "gs:// is not a storage Nitro writes to" in str(e.value)
    assert "s3://bucket/prefix" in str(e.value)
    with pytest.raises(ConfigError, match="names no valid bucket"):
        read_manifest("s3://A_b/run")
    with pytest.raises(ConfigError, match=r"'\.\.' segment"):
        read_manifest(f"s3://{bucket}/a/../b")
    with pytest.raises(ConfigError) as e:
        read_manifest("s3://no-such-bucket-nitro/run")
    assert "Bucket 'no-such-bucket-nitro' does not exist at http://127.0.0.1:" in str(e.value)
    assert "aws s3 mb s3://no-such-bucket-nitro" in str(e.value)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(ConfigError) as e:
        read_manifest(f"s3://{bucket}/{prefix}")
    assert f"No AWS credentials found for s3://{bucket}/{prefix}/manifest.json" in str(e.value)
    assert "AWS_ACCESS_KEY_ID" in str(e.value)
    assert keys(client, bucket, prefix) == set()  # nothing written by a refusal


@pytest.mark.slow  # subprocesses, or many trials
def test_the_cli_pushes_a_run_and_reads_it_back_from_s3(s3, tmp_path, prefix):
    client, bucket = s3
    local = tmp_path / "run"
    trained(local, epochs=2)
    url = f"s3://{bucket}/{prefix}/run"

    def nitro(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "nitro_mcp", *args], capture_output=True, text=True,
            timeout=600, cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO), "NITRO_STAGING": str(tmp_path / "st")},
        )  # fmt: skip

    done = nitro("push", str(local), url)
    assert done.returncode == 0, done.stderr
    files = [e.file for e in read_manifest(local)]
    assert done.stdout.splitlines()[-1] == f"2 record(s) committed to {url}"
    done = nitro("manifest", url, "--json")
    assert done.returncode == 0, done.stderr
    assert [e["file"] for e in json.loads(done.stdout)["entries"]] == files
    done = nitro("verify", url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "2 record(s) checked, 0 corrupt"
    done = nitro("info", f"{url}/{files[-1]}", "--json")
    assert json.loads(done.stdout)["header"]["step"] == read_manifest(local)[-1].step
    done = nitro("push", str(local), "gs://bucket/run")
    assert done.returncode == 2
    assert "gs:// is not a storage Nitro writes to" in done.stderr
    trained_url = f"s3://{bucket}/{prefix}/cli-train"
    done = nitro("train", "Regression", "--run-dir", trained_url, "--set", "max_epochs=2")
    assert done.returncode == 0, done.stderr
    assert f"in {trained_url}: " in done.stderr  # the URL, not the staging directory
    assert [e.epoch for e in read_manifest(trained_url)] == [1, 2]
    done = nitro("validate", "Regression", "--run-dir", trained_url, "--weights", "latest => best")
    assert done.returncode == 0, done.stderr
    assert "checkpoint: " in done.stdout
    done = nitro("average", trained_url, "--source", "latest => Average(Last(2))",
                 "--save", f"{trained_url}-avg/two.safetensors")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"saved: {trained_url}-avg/two.safetensors" in done.stdout
    assert f"directory: {trained_url}" in done.stdout
    done = nitro("export", "latest => best", "w.safetensors", "--run-dir", trained_url)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "w.safetensors").is_file()
    first = read_manifest(trained_url)[0].file
    done = nitro("delete", trained_url, "--file", first, "--no-dry-run")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{trained_url}: deleted 1 file(s)"), done.stdout
    assert [e.epoch for e in read_manifest(trained_url)] == [2]


class Wide(Tiny):
    """A record of ~12.6 MB: an upload spans three 5 MiB parts when parts are that small."""

    def build_model(self):
        return torch.nn.Sequential(
            torch.nn.Linear(self.width, 1024), torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 1)
        )


PUSHER = textwrap.dedent(
    """
    import sys
    from nitro_core.store import objects
    objects.PART = 5 * 1024 * 1024  # S3's smallest part: every record goes up in parts
    from nitro_core.transfer import push
    push(sys.argv[1], sys.argv[2])
    print("pushed", flush=True)
    """
)


@pytest.mark.slow  # subprocesses, or many trials
def test_killing_a_push_at_random_moments_never_lists_a_missing_or_partial_object(
    s3, tmp_path, prefix
):
    client, bucket = s3
    local = tmp_path / "run"
    trained(local, Wide, epochs=4)
    on_disk = read_manifest(local)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rng = random.Random(0)
    full = time.monotonic()
    done = subprocess.run([sys.executable, "-c", PUSHER, str(local), f"s3://{bucket}/{prefix}/full"],
                          env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    span = time.monotonic() - full  # how long a push takes here: the kills fall inside it
    for trial in range(30):
        url = f"s3://{bucket}/{prefix}/k{trial}"
        killed_unless_done([sys.executable, "-c", PUSHER, str(local), url], env,
                           rng.uniform(0.3, 1.0) * span)  # fmt: skip
        listed = read_manifest(url)
        assert [(e.digest, e.step) for e in listed] == [
            (e.digest, e.step) for e in on_disk[: len(listed)]
        ]  # a prefix of the local run, in order, nothing twice
        for e in listed:  # every listed object whole: its size, its bytes' digests
            head = client.head_object(Bucket=bucket, Key=f"{prefix}/k{trial}/{e.file}")
            assert head["ContentLength"] == e.bytes
        if listed:
            assert all(c.ok for c in verify(url))
        push(local, url)  # the next push finishes it; an orphan's name is never reused
        finished = read_manifest(url)
        assert [(e.digest, e.step) for e in finished] == [(e.digest, e.step) for e in on_disk]
        assert len({e.file for e in finished}) == len(on_disk)


def params(n: Nitro) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in n.model.state_dict().items()}


def test_a_run_trained_on_s3_resumes_bit_for_bit(s3, tmp_path, prefix, monkeypatch):
    client, bucket = s3
    monkeypatch.setenv("NITRO_STAGING", str(tmp_path / "staging"))
    url = f"s3://{bucket}/{prefix}/run"
    a = trained(tmp_path / "a", KeepMany, epochs=4)  # run A, on disk, uninterrupted
    b = Nitro(KeepMany(max_epochs=2), run_dir=url, resume=False)
    b.train()  # run B: two epochs, on S3
    listed = read_manifest(url)
    assert [e.epoch for e in listed] == [1, 2]
    assert keys(client, bucket, f"{prefix}/run") == {"manifest.json", *(e.file for e in listed)}
    for named in (listed[-1].file, f"{url}/{listed[-1].file}"):  # by its name, by its URL
        h = Nitro(KeepMany(max_epochs=4), run_dir=url, resume=named)
        assert (h.run_id, h.epoch) == (b.run_id, 2)  # read on S3, continued
        h.close()
    branch = Nitro(
        KeepMany(max_epochs=4), run_dir=tmp_path / "b2", resume=f"{url}/{listed[0].file}"
    )
    assert branch.run_id != b.run_id and branch.epoch == 1  # another directory's: a branch
    branch.close()
    with pytest.raises(CheckpointMissing, match="is not a record the manifest"):
        Nitro(KeepMany(max_epochs=4), run_dir=url, resume="nothing.safetensors")
    c = Nitro(KeepMany(max_epochs=4), run_dir=url, resume="auto")  # run C: B's record, down
    assert c.run_id == b.run_id and c.epoch == 2
    c.train()
    final_a, final_c = params(a), params(c)
    assert final_a.keys() == final_c.keys()
    for k in final_a:
        assert torch.equal(final_a[k], final_c[k]), k  # A == B + C, bit for bit
    on_s3, on_disk = read_manifest(url), read_manifest(tmp_path / "a")
    assert [(e.epoch, e.step, e.score) for e in on_s3] == [
        (e.epoch, e.step, e.score) for e in on_disk
    ]
    assert all(c.ok for c in verify(url))
    staged = object_run.staging(objects.parse(url))
    assert staged == tmp_path / "staging" / bucket / prefix / "run"
    uploaded = {e.file for e in on_s3} - {on_s3[0].file, on_s3[1].file}  # resumed: copied down
    assert not uploaded & {p.name for p in staged.iterdir()}  # each uploaded, then removed


def test_a_resume_unlists_a_killed_run_record_whose_commit_landed_after_it_read(
    s3, tmp_path, prefix, monkeypatch, caplog
):
    client, bucket = s3
    monkeypatch.setenv("NITRO_STAGING", str(tmp_path / "staging"))
    url = objects.parse(f"s3://{bucket}/{prefix}/run")
    Nitro(KeepMany(max_epochs=3), run_dir=str(url), resume=False).train()
    first = read_manifest(str(url))
    late = first[-1]  # the killed run's last commit: sent whole before the kill, not applied

    def unlisted(state):
        state.entries = [e for e in state.entries if e.file != late.file]

    object_run.commit(url, unlisted)
    upload = object_run.upload

    def landing(run, local, name, run_id):  # it lands while the resume writes that epoch
        object_run.commit(run, lambda state: state.entries.append(late))
        return upload(run, local, name, run_id)

    monkeypatch.setattr(object_run, "upload", landing)
    resumed = Nitro(KeepMany(max_epochs=3), run_dir=str(url), resume="auto")
    assert (resumed.run_id, resumed.step) == (late.run, first[-2].step)
    resumed.train()  # epoch 3 again: its record replaces the killed timeline's
    listed = read_manifest(str(url))
    assert [e.file for e in listed[:2]] == [e.file for e in first[:2]]
    assert [e.step for e in listed] == [e.step for e in first]  # one record a point
    assert listed[2].file != late.file and listed[2].digest != late.digest  # the resume's own
    assert keys(client, bucket, f"{prefix}/run") == {"manifest.json", *(e.file for e in listed)}
    assert f"unlisting ['{late.file}'], written by a killed process of run" in caplog.text
    assert all(c.ok for c in verify(str(url)))


def test_retention_of_a_run_trained_on_s3_matches_the_disk(s3, tmp_path, prefix, monkeypatch):
    client, bucket = s3
    monkeypatch.setenv("NITRO_STAGING", str(tmp_path / "staging"))
    url = f"s3://{bucket}/{prefix}/run"
    trained(tmp_path / "disk", KeepLast, epochs=4)
    n = Nitro(KeepLast(max_epochs=4), run_dir=url, resume=False)
    n.train()
    on_disk = [(e.epoch, e.step, e.score) for e in read_manifest(tmp_path / "disk")]
    assert [(e.epoch, e.step, e.score) for e in read_manifest(url)] == on_disk  # Last(2)
    assert keys(client, bucket, f"{prefix}/run") == {
        "manifest.json",
        *(e.file for e in read_manifest(url)),
    }  # the two dropped records' objects deleted


TRAINER = textwrap.dedent(
    """
    import sys
    from nitro_core import Nitro
    from tests.nitro_core.store.test_object_storage import Wide
    import time
    from nitro_core.store import objects
    objects.PART = 5 * 1024 * 1024  # every record goes up in parts
    call = objects.Bucket._call

    def slowed(self, op, **kwargs):  # uploads take most of the run: the kills land in them
        if op in ("upload_part", "complete_multipart_upload", "put_object"):
            time.sleep(0.05)
        return call(self, op, **kwargs)

    objects.Bucket._call = slowed
    Nitro(Wide(max_epochs=int(sys.argv[2])), run_dir=sys.argv[1], resume="auto").train()
    """
)


@pytest.mark.slow  # subprocesses, or many trials
def test_killing_a_trainer_during_uploads_never_lists_a_partial_object(
    s3, tmp_path, prefix, monkeypatch
):
    client, bucket = s3
    reference = trained(tmp_path / "ref", Wide, epochs=3)
    env = {**os.environ, "PYTHONPATH": str(REPO), "NITRO_STAGING": str(tmp_path / "staging"),
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    rng = random.Random(1)
    started = time.monotonic()
    url = f"s3://{bucket}/{prefix}/timing"
    done = subprocess.run([sys.executable, "-c", TRAINER, url, "3"], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    span = time.monotonic() - started
    for trial in range(30):
        url = f"s3://{bucket}/{prefix}/k{trial}"
        killed_unless_done([sys.executable, "-c", TRAINER, url, "3"], env,
                           rng.uniform(0.4, 1.0) * span)  # fmt: skip
        for e in read_manifest(url):  # every listed object whole
            head = client.head_object(Bucket=bucket, Key=f"{prefix}/k{trial}/{e.file}")
            assert head["ContentLength"] == e.bytes, (trial, e.file)
        monkeypatch.setenv("NITRO_STAGING", env["NITRO_STAGING"])
        monkeypatch.setenv("NITRO_RECLAIM_AFTER_S", "0")  # no live writer: reclaim at once
        resumed = Nitro(Wide(max_epochs=3), run_dir=url, resume="auto")
        resumed.train()
        for k, v in params(reference).items():
            assert torch.equal(v, params(resumed)[k]), (trial, k)  # the resume is exact
        assert [e.epoch for e in read_manifest(url)][-1] == 3
        # nothing the kill left stays once the run is written again (issue 34): a request
        # the killed trainer sent whole may land while the resume trains, after its reclaim,
        # so the next one (a later write's) takes what came late
        open_run(url).reclaim()
        listed = {e.file for e in read_manifest(url)} | {"manifest.json"}
        assert keys(client, bucket, f"{prefix}/k{trial}") == listed, trial
        open_uploads = client.list_multipart_uploads(Bucket=bucket, Prefix=f"{prefix}/k{trial}/")
        assert not open_uploads.get("Uploads"), (trial, open_uploads["Uploads"])


def test_weights_restore_best_and_averages_read_an_s3_run_as_the_same_run_on_disk(
    s3, tmp_path, prefix, monkeypatch
):
    client, bucket = s3
    monkeypatch.setenv("NITRO_STAGING", str(tmp_path / "staging"))
    url = f"s3://{bucket}/{prefix}/run"
    disk = tmp_path / "disk"
    ran_disk = trained(disk, KeepMany, epochs=4)
    ran_s3 = Nitro(KeepMany(max_epochs=4), run_dir=url, resume=False, restore_best=True)
    ran_s3.train()  # ends holding its best record's weights, copied down from S3
    best = Nitro(KeepMany(max_epochs=4), run_dir=disk, weights=f"{ran_disk.run_id} => best")
    for k, v in params(best).items():
        assert torch.equal(v, params(ran_s3)[k]), k
    for source in ("{run} => best", "{run} => Average(Last(3))", "{run} => latest"):
        on_s3 = Nitro(KeepMany(max_epochs=1), run_dir=url,
                      weights=source.format(run=ran_s3.run_id))  # fmt: skip
        on_disk = Nitro(KeepMany(max_epochs=1), run_dir=disk,
                        weights=source.format(run=ran_disk.run_id))  # fmt: skip
        for k, v in params(on_disk).items():
            assert torch.equal(v, params(on_s3)[k]), (source, k)
    assert len(read_manifest(url)) == 4  # reading wrote nothing
    last = read_manifest(url)[-1].file  # a record of another S3 run directory, by its URL
    for run_dir in (f"s3://{bucket}/{prefix}/other", tmp_path / "elsewhere"):
        taken = Nitro(KeepMany(max_epochs=1), run_dir=run_dir, weights=f"{url}/{last}")
        for k, v in params(ran_s3).items():
            assert torch.equal(v, params(taken)[k]), (run_dir, k)
        assert str(taken.checkpoint_source).endswith(last)
    with pytest.raises(CheckpointMissing, match="is not a record the manifest"):
        Nitro(KeepMany(max_epochs=1), run_dir=tmp_path / "x", weights=f"{url}/nothing.safetensors")


def test_averages_exports_and_deletions_take_an_s3_run_directory(s3, tmp_path, prefix, monkeypatch):
    client, bucket = s3
    monkeypatch.setenv("NITRO_STAGING", str(tmp_path / "staging"))
    url = f"s3://{bucket}/{prefix}/run"
    disk = tmp_path / "disk"
    trained(disk, KeepMany, epochs=4)
    push(disk, url)
    source = "latest => Average(Last(3))"
    here = average_checkpoints(disk, source, save=tmp_path / "avg.safetensors")
    there = average_checkpoints(url, source, save=f"{url}-out/avg.safetensors")
    for k, v in here.state.items():
        assert torch.equal(v, there.state[k]), k
    assert there.averaged_from["directory"] == url
    assert there.averaged_from["files"] == here.averaged_from["files"]
    got = tmp_path / "got.safetensors"
    client.download_file(bucket, f"{prefix}/run-out/avg.safetensors", str(got))
    saved, local = load_file(got), load_file(tmp_path / "avg.safetensors")
    assert saved.keys() == local.keys() and all(torch.equal(saved[k], local[k]) for k in saved)
    with pytest.raises(ConfigError, match="already exists; Nitro never overwrites an object"):
        average_checkpoints(url, source, save=f"{url}-out/avg.safetensors")
    with pytest.raises(ConfigError, match="must name a .safetensors object"):
        average_checkpoints(url, source, save=f"{url}-out/avg.pt")
    assert "avg.safetensors" not in {e.file for e in read_manifest(url)}  # outside it

    exported = export_weights("latest => best", f"{url}-out/w.safetensors", run_dir=url)
    assert str(exported) == f"{url}-out/w.safetensors"
    export_weights("latest => best", tmp_path / "w.safetensors", run_dir=disk)
    client.download_file(bucket, f"{prefix}/run-out/w.safetensors", str(got))
    w_s3, w_disk = load_file(got), load_file(tmp_path / "w.safetensors")
    assert w_s3.keys() == w_disk.keys() and all(torch.equal(w_s3[k], w_disk[k]) for k in w_s3)
    last = read_manifest(url)[-1].file
    by_url = export_weights(f"{url}/{last}", tmp_path / "last.safetensors")  # no run_dir
    by_name = export_weights(last, tmp_path / "last2.safetensors", run_dir=url)
    a, b = load_file(by_url), load_file(by_name)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the saved average is a record on its own (no manifest beside it): a source as on a
    # disk (issue 34); an unlisted object beside the run's manifest is still refused
    again = load_file(
        export_weights("avg.safetensors", tmp_path / "x.safetensors", run_dir=f"{url}-out")
    )
    assert again.keys() == there.state.keys()
    assert all(torch.equal(again[k], there.state[k]) for k in again)
    client.download_file(bucket, f"{prefix}/run/{last}", str(got))
    client.upload_file(str(got), bucket, f"{prefix}/run/stray.safetensors")
    with pytest.raises(CheckpointMissing, match="is not a record the manifest"):
        export_weights("stray.safetensors", tmp_path / "y.safetensors", run_dir=url)
    client.delete_object(Bucket=bucket, Key=f"{prefix}/run/stray.safetensors")
    exp = experiment_from_record(KeepMany, "latest => latest", run_dir=url)
    assert exp.max_epochs == 4

    first = read_manifest(url)[0]
    dry = delete_checkpoints(url, files=[first.file])
    assert dry.dry_run and [(f.path, f.bytes) for f in dry.files] == [(first.file, first.bytes)]
    assert first.file in keys(client, bucket, f"{prefix}/run")  # a dry run deletes nothing
    done = delete_checkpoints(url, files=[first.file], dry_run=False)
    delete_checkpoints(disk, files=[first.file], dry_run=False)
    assert str(done.run_dir) == url and not done.dry_run
    assert [e.file for e in read_manifest(url)] == [e.file for e in read_manifest(disk)]
    assert first.file not in keys(client, bucket, f"{prefix}/run")
    run = first.run
    whole = delete_checkpoints(url, run=run, dry_run=False)
    assert whole.runs == (run,) and read_manifest(url) == [] and runs(url) == []
    assert keys(client, bucket, f"{prefix}/run") == {"manifest.json"}
    with pytest.raises(CheckpointNotFound, match="Nothing to delete"):
        delete_checkpoints(url, run=run)


def two_ranks_a_and_b(s3, tmp_path, prefix, monkeypatch, strategy: str):
    """Run A (4 epochs on disk) and run B (2 epochs on S3) of rank_script.py on 2 ranks
    under ``strategy``: (B's URL, A's directory, where B and C write their final weights,
    the environment that says so)."""
    from tests.nitro_core.distributed.conftest import torchrun

    monkeypatch.setenv("NITRO_STAGING", str(tmp_path / "staging"))
    url, out, a = f"s3://{s3[1]}/{prefix}/{strategy}", tmp_path / "out", tmp_path / "a"
    torchrun(2, a, 4, "false", strategy)  # run A, on disk
    env = {"NITRO_TEST_OUT": str(out)}
    torchrun(2, url, 2, "false", strategy, env=env)  # run B, on S3 (FSDP: a shard a rank)
    return url, a, out, env


@pytest.mark.slow  # torchrun, 2 processes
def test_a_ddp_run_on_s3_resumes_bit_for_bit_on_every_rank(s3, tmp_path, prefix, monkeypatch):
    from tests.nitro_core.distributed.conftest import assert_same_final, torchrun

    client, bucket = s3
    url, a, out, env = two_ranks_a_and_b(s3, tmp_path, prefix, monkeypatch, "ddp")
    torchrun(2, url, 4, "auto", "ddp", env=env)  # run C: B's record, copied down on each rank
    assert_same_final(a, "4-false-ddp-w2", out, "4-auto-ddp-w2")  # A == B + C
    listed = read_manifest(url)
    assert [e.epoch for e in listed] == [1, 2, 3, 4]  # one record a point, rank 0's
    assert [e.epoch for e in read_manifest(a)] == [1, 2, 3, 4]
    assert keys(client, bucket, f"{prefix}/ddp") == {"manifest.json", *(e.file for e in listed)}
    assert checkpoint_info(f"{url}/{listed[-1].file}")["distributed"] == {
        "world": 2,
        "strategy": "ddp",
    }
    assert all(c.ok for c in verify(url))


@pytest.mark.slow  # torchrun, 2 processes
def test_an_fsdp_run_on_s3_writes_sharded_records_and_resumes_bit_for_bit(
    s3, tmp_path, prefix, monkeypatch
):
    from tests.nitro_core.distributed.conftest import assert_same_final, torchrun

    client, bucket = s3
    url, a, out, env = two_ranks_a_and_b(s3, tmp_path, prefix, monkeypatch, "fsdp")
    listed = read_manifest(url)
    assert [e.epoch for e in listed] == [1, 2]
    shard_names = {".claim", "header.json", *(f"shard-0000{r}-model-00001-of-00001.safetensors" for r in (1, 2))}  # fmt: skip
    assert keys(client, bucket, f"{prefix}/fsdp") == {
        "manifest.json",
        *(f"{e.file}/{name}" for e in listed for name in shard_names),
    }  # a fresh prefix a record, header.json naming each shard's digest
    third = read_manifest(a)[2].file  # the name run C's third record takes (C == A)
    orphan = f"{prefix}/fsdp/{third}/shard-00001-model-00001-of-00001.safetensors"
    client.put_object(Bucket=bucket, Key=orphan, Body=b"half")  # a killed write's leftover
    torchrun(2, url, 4, "auto", "fsdp", env=env)  # run C: B's record copied down, resharded
    assert_same_final(a, "4-false-fsdp-w2", out, "4-auto-fsdp-w2")  # A == B + C
    listed = read_manifest(url)
    assert [e.epoch for e in listed] == [1, 2, 3, 4]
    for e in listed:  # its bytes: the objects under its prefix, summed
        r = client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/fsdp/{e.file}/")
        sizes = [o["Size"] for o in r["Contents"] if not o["Key"].endswith("/.claim")]
        assert e.bytes == sum(sizes), e.file
    assert listed[2].file.startswith(f"{third}-run-")  # the orphan's name is never reused
    assert client.get_object(Bucket=bucket, Key=orphan)["Body"].read() == b"half"
    assert checkpoint_info(f"{url}/{listed[-1].file}")["distributed"] == {
        "world": 2,
        "strategy": "fsdp",
    }
    assert [(c.file, c.ok) for c in verify(url)] == [(e.file, True) for e in listed]
    one = verify(f"{url}/{listed[0].file}")  # a record directory, by its URL
    assert [(c.file, c.ok) for c in one] == [(listed[0].file, True)]
    weights = Nitro(  # one process reads the sharded record from S3 as it does from a disk
        __import__("tests.nitro_core.distributed.rank_script", fromlist=["x"]).DistRegression(
            max_epochs=1, samples=520, batch_size=32
        ),
        run_dir=url,
        weights="latest => latest",
    )
    on_disk = Nitro(weights.experiment, run_dir=a, weights="latest => latest")
    for k, v in on_disk.model.state_dict().items():
        assert torch.equal(v, weights.model.state_dict()[k]), k
    pushed = push(a, f"s3://{bucket}/{prefix}/pushed")  # run A's sharded records, pushed
    assert [e.file for e in pushed] == [e.file for e in read_manifest(a)]
    checked = verify(f"s3://{bucket}/{prefix}/pushed")
    assert [(c.file, c.ok) for c in checked] == [(e.file, True) for e in pushed]
    assert push(a, f"s3://{bucket}/{prefix}/pushed") == []  # again: nothing twice


@pytest.mark.slow  # torchrun, 2 processes, killed
def test_killing_fsdp_ranks_during_shard_uploads_never_lists_a_partial_record(
    s3, tmp_path, prefix, monkeypatch
):
    from tests.nitro_core.distributed.conftest import (
        SCRIPT,
        assert_same_final,
        rank_pids,
        torchrun,
    )

    client, bucket = s3
    url, a, out, env = two_ranks_a_and_b(s3, tmp_path, prefix, monkeypatch, "fsdp")
    rng = random.Random(22)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(SCRIPT), url, "4", "auto", "fsdp",
    ]  # fmt: skip
    slowed = {**os.environ, **env, "OMP_NUM_THREADS": "1", "NITRO_TEST_SLOW_UPLOAD": "1.0",
              "PYTHONUNBUFFERED": "1"}  # fmt: skip
    killed, logs = 0, []
    for trial in range(4):  # each: the ranks killed at a random moment of a record's uploads
        for marker in out.glob("uploading-*"):
            marker.unlink()
        logs.append(tmp_path / f"trial-{trial}.log")
        with open(logs[-1], "wb") as log:
            proc = subprocess.Popen(command, env=slowed, start_new_session=True,
                                    stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        deadline = time.monotonic() + 300
        while not any(out.glob("uploading-*")) and proc.poll() is None:
            assert time.monotonic() < deadline, "no shard upload began"
            time.sleep(0.05)
        if proc.poll() is None:
            time.sleep(rng.uniform(0, 1.5))  # inside a record's uploads (1 s), or after its commit
            ranks = rank_pids(proc.pid)  # torchrun starts each rank in a session of its own
            for pid in [*ranks.values(), proc.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            killed += 1
        proc.wait()
        logs[-1].write_text(logs[-1].read_text() + f"\n[exit {proc.returncode}]")
        listed = read_manifest(url)
        checks = verify(url)  # every listed record whole: each shard against header.json
        assert [(c.file, c.ok) for c in checks] == [(e.file, True) for e in listed], checks
    assert killed == 4, "\n".join(p.read_text()[-3000:] for p in logs)
    torchrun(2, url, 4, "auto", "fsdp", env=env)  # the rest, from the last listed record
    assert_same_final(a, "4-false-fsdp-w2", out, "4-auto-fsdp-w2")  # bit for bit
    assert [e.epoch for e in read_manifest(url)] == [1, 2, 3, 4]


class WideMany(Wide):
    def checkpointer(self):
        return Checkpointer(keep=Last(20))


def weights_bytes(path: Path) -> int:
    """A record file's header and its params/buffers/EMA bytes (what a weights read needs)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    sections = ("params/", "buffers/", "ema/")
    return (
        8
        + n
        + sum(
            v["data_offsets"][1] - v["data_offsets"][0]
            for k, v in header.items()
            if k.startswith(sections)
        )
    )


def test_an_average_on_s3_reads_the_weights_ranges_only(s3, tmp_path, prefix, monkeypatch):
    monkeypatch.setenv("NITRO_STAGING", str(tmp_path / "staging"))
    disk, url = tmp_path / "wide", f"s3://{s3[1]}/{prefix}/wide"
    trained(disk, WideMany, epochs=3)  # AdamW: two moments a parameter, ~2/3 of each record
    push(disk, url)
    got: list[tuple[str, int, int]] = []
    real = objects.Bucket.get_range

    def counted(self, key, start, stop):
        got.append((key, start, stop))
        return real(self, key, start, stop)

    monkeypatch.setattr(objects.Bucket, "get_range", counted)
    source = "latest => Average(Last(3))"
    here, there = average_checkpoints(disk, source), average_checkpoints(url, source)
    for k, v in here.state.items():
        assert torch.equal(v, there.state[k]), k
    picked = here.averaged_from["files"]
    fetched = sum(b - a for key, a, b in got if key.rsplit("/", 1)[-1] in picked)
    whole = sum((disk / f).stat().st_size for f in picked)
    needed = sum(weights_bytes(disk / f) for f in picked)
    assert needed < 0.4 * whole  # the optimizer's moments are most of each record
    assert needed <= fetched <= needed + len(picked) * 64 * 1024  # + each first header read
    staged = object_run.staging(objects.parse(url))
    assert not [p for p in staged.iterdir() if p.name.startswith(".weights-")]  # removed


def test_weights_loads_exports_and_restore_best_on_s3_fetch_the_weights_sections_alone(
    s3, tmp_path, prefix, monkeypatch
):
    """An export, a weights load and restore_best read a record's params, buffers and EMA,
    never its optimizer's moments: those sections come by ranged reads into a copy kept in
    the staging directory (the next read fetches nothing); restore_optimizer takes the
    record whole. An export of an average reads the picks' weights ranges alone."""
    monkeypatch.setenv("NITRO_STAGING", str(tmp_path / "staging"))
    disk, url = tmp_path / "wide", f"s3://{s3[1]}/{prefix}/wide"
    ran = trained(disk, WideMany, epochs=2)
    push(disk, url)
    ranged: list[tuple[str, int, int]] = []
    whole: list[str] = []
    real_range, real_download = objects.Bucket.get_range, objects.Bucket.download

    def get_range(self, key, start, stop):
        ranged.append((key, start, stop))
        return real_range(self, key, start, stop)

    def download(self, key, size, fd):
        whole.append(key.rsplit("/", 1)[-1])
        return real_download(self, key, size, fd)

    monkeypatch.setattr(objects.Bucket, "get_range", get_range)
    monkeypatch.setattr(objects.Bucket, "download", download)
    last = read_manifest(disk)[-1].file
    exported = export_weights(f"{url}/{last}", tmp_path / "s3.safetensors")
    fetched = sum(b - a for key, a, b in ranged if key.endswith(last))
    needed = weights_bytes(disk / last)
    assert needed < 0.4 * (disk / last).stat().st_size  # AdamW's moments: most of it
    assert needed <= fetched <= needed + 64 * 1024 and whole == []  # + the first header read
    same = load_file(export_weights(disk / last, tmp_path / "disk.safetensors"))
    assert same.keys() == load_file(exported).keys()
    assert all(torch.equal(v, same[k]) for k, v in load_file(exported).items())

    ranged.clear()
    on_disk = Nitro(WideMany(max_epochs=1), run_dir=tmp_path / "a", weights=str(disk / last))
    on_s3 = Nitro(WideMany(max_epochs=1), run_dir=tmp_path / "b", weights=f"{url}/{last}")
    assert [key for key, *_ in ranged if key.endswith(last)] == [] and whole == []  # the copy
    for k, v in params(on_disk).items():
        assert torch.equal(v, params(on_s3)[k]), k
    assert on_s3.parent == on_disk.parent == f"{ran.run_id}/{last}"

    with_opt = {"weights": f"{url}/{last}", "restore_optimizer": True}
    full = Nitro(WideMany(max_epochs=1), run_dir=tmp_path / "d", **with_opt)
    assert whole == [last]  # every section: the record, whole
    local = Nitro(WideMany(max_epochs=1), run_dir=tmp_path / "e", **{**with_opt,
                  "weights": str(disk / last)})  # fmt: skip
    moments = [s["exp_avg"] for s in full.optimizer.state_dict()["state"].values()]
    assert moments and all(
        torch.equal(m, s["exp_avg"])
        for m, s in zip(moments, local.optimizer.state_dict()["state"].values())
    )

    source = "latest => Average(Last(2))"
    averaged = load_file(export_weights(source, tmp_path / "avg-s3.safetensors", run_dir=url))
    same = load_file(export_weights(source, tmp_path / "avg-disk.safetensors", run_dir=disk))
    assert averaged.keys() == same.keys() and all(
        torch.equal(v, same[k]) for k, v in averaged.items()
    )
    assert whole == [last]  # the picks' weights ranges alone

    whole.clear()
    best_url = f"s3://{s3[1]}/{prefix}/best"
    n = Nitro(WideMany(max_epochs=2), run_dir=best_url, restore_best=True)
    n.train()
    assert whole == []  # the best record's weights sections alone
    best = min(read_manifest(best_url), key=lambda e: e.score)
    client, bucket = s3
    copy = tmp_path / "best.safetensors"
    client.download_file(bucket, f"{prefix}/best/{best.file}", str(copy))
    saved = load_file(copy)
    for k, v in n.model.state_dict().items():
        assert torch.equal(v, saved[f"params/{k}"]), k
    with pytest.raises(TrainingRefused) as refused:  # what to write names the URL
        n.train()
    assert f"run_dir='{best_url}', resume='{n.run_id} => best')" in str(refused.value)
    assert str(tmp_path) not in str(refused.value)  # never the staging directory
