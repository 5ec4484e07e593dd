"""The pre-flight written once (DESIGN section 16): ``plan`` checks a training call from its
values, the manifest and the record headers alone; the gate calls it before submitting and
the handle starts from the same ``Plan``. On object storage the resumed record's header is
read by ranged reads and the record itself is fetched only by the handle."""

from __future__ import annotations

import uuid

import boto3
import pytest

from nitro_core import Nitro, average_checkpoints
from nitro_core.averaging import write_averaged
from nitro_core.errors import ConfigError, ResumeRefused
from nitro_core.training.plan import plan
from nitro_core.transfer import push
from tests.nitro_core.tiny import Tiny
from tests.s3_server import settings


def _trained(run, epochs=2):
    Nitro(Tiny(max_epochs=epochs), run_dir=run).train()


def test_the_handle_starts_from_the_plan_the_gate_makes(tmp_path):
    run = tmp_path / "run"
    _trained(run)
    planned = plan(run, resume="auto", seed=3, max_steps=100)
    assert planned.point is not None and planned.point.meta["epoch"] == 2
    assert planned.point.continue_run == planned.entries[-1].run
    n = Nitro(Tiny(max_epochs=3), run_dir=run, resume="auto", max_steps=100)
    assert n.plan.point is not None and n.plan.point.file == planned.point.file
    assert n.plan.options == planned.options and n.plan.entries == planned.entries
    assert n.budget is n.plan.budget and n.budget.max_steps == 100
    assert n.checkpoint_source == planned.point.path


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"max_steps": 0}, "max_steps=0"),
        ({"seed": -1}, "seed=-1 is not a seed; write an integer from 0 to 2**63 - 1, e.g. seed=0."),
        ({"seed": 10**300}, "seed=(an integer of about 301 digits) is not a seed"),
        ({"device": "mps"}, "device='mps' is not a device; write 'auto', 'cpu' or 'cuda:0'."),
        ({"device": "x" * 500}, f"device='{'x' * 80}…' is not a device"),
        ({"resume": True, "weights": "latest => latest"}, "resume"),
    ],
)  # fmt: skip
def test_a_bad_call_is_refused_by_the_plan_before_anything_is_built(tmp_path, kwargs, text):
    with pytest.raises(ConfigError) as caught:
        plan(tmp_path / "run", **kwargs)
    assert text in str(caught.value)
    assert not (tmp_path / "run").exists()  # it reads; it never creates


def test_a_weights_only_record_is_refused_as_a_resume(tmp_path):
    run = tmp_path / "run"
    _trained(run)
    averaged = average_checkpoints(run, "latest => Average(Last(2))")
    write_averaged(averaged, tmp_path / "avg.safetensors")
    with pytest.raises(ResumeRefused, match="it holds weights only"):
        plan(run, resume=str(tmp_path / "avg.safetensors"))
    assert plan(run / "empty", resume="auto").point is None  # nothing to resume: fresh


def test_on_object_storage_the_plan_reads_the_header_and_the_handle_fetches(
    tmp_path, s3_endpoint, monkeypatch
):
    for k, v in settings(s3_endpoint).items():
        monkeypatch.setenv(k, v)
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    try:
        client.create_bucket(Bucket="nitro-plan")
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    url = f"s3://nitro-plan/{uuid.uuid4().hex[:8]}/run"
    _trained(tmp_path / "local")
    push(tmp_path / "local", url)
    planned = plan(url, resume="auto")
    assert planned.point is not None and planned.point.meta["epoch"] == 2
    assert not planned.point.path.exists()  # the header alone, by ranged reads
    fetched = planned.fetched_point()
    assert fetched is not None and fetched.path.exists() and fetched.meta == planned.point.meta
