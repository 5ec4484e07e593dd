"""The boundaries of DESIGN section 16, end to end through a real server and its fork
server: one job's changes never reach the next (a validation's metrics are bitwise the same
warm, cold and through the Python API, whatever ran before it), and the operator's
experiment code never runs in the server process (the server here is this test's own
process: a ``build_model`` that calls ``os._exit``, segfaults or raises ``SystemExit`` would
end the test run itself)."""

from __future__ import annotations

import os

import anyio
import pytest
from mcp import Client

from nitro_core import Nitro, read_manifest
from nitro_core.registry import load_registry
from nitro_mcp.server import build_server
from tests.nitro_mcp.conftest import call, ended

MODULE = '''
import ctypes
import os
import random

import torch
import torch.nn.functional as F

from nitro_core.examples import Regression


class Plain(Regression):
    """Regression whose metrics say what of the process it sees."""

    def metrics(self, model, batch):
        n = len(batch["y"])
        seen = {
            "env": "NITRO_POLLUTED" in os.environ,
            "cwd": os.getcwd() == "/",
            "kept": hasattr(torch, "_nitro_kept"),
            "dtype64": torch.get_default_dtype() == torch.float64,
        }
        return {k: (float(v) * n, n) for k, v in seen.items()}

    def eval_loss(self):
        return True


class PatchFunction(Plain):
    def build_model(self):
        original = F.mse_loss
        torch.nn.functional.mse_loss = lambda *a, **k: original(*a, **k) * 0.5
        return super().build_model()


class PatchClass(Plain):
    def build_model(self):
        original = torch.nn.Linear.forward
        torch.nn.Linear.forward = lambda self, x: original(self, x) * 2
        return super().build_model()


class DefaultDtype(Plain):
    def build_model(self):
        torch.set_default_dtype(torch.float64)
        return super().build_model()


class GlobalSeed(Plain):
    def build_model(self):
        torch.manual_seed(1234)
        random.seed(1234)
        return super().build_model()


class Environment(Plain):
    def build_model(self):
        os.environ["NITRO_POLLUTED"] = "1"
        return super().build_model()


class WorkingDir(Plain):
    def build_model(self):
        os.chdir("/")
        return super().build_model()


class KeepsMemory(Plain):
    def build_model(self):
        torch._nitro_kept = torch.ones(2**28)  # 1 GiB, kept by a module global
        return super().build_model()


class Exits(Plain):
    def build_model(self):
        os._exit(3)


class Segfaults(Plain):
    def build_model(self):
        ctypes.string_at(0)


class RaisesSystemExit(Plain):
    def build_model(self):
        raise SystemExit("the experiment's own exit")
'''
POLLUTERS = ["PatchFunction", "PatchClass", "DefaultDtype", "GlobalSeed", "Environment",
             "WorkingDir", "KeepsMemory"]  # fmt: skip
HOSTILE = ["Exits", "Segfaults", "RaisesSystemExit"]
FAST = {"max_epochs": 1, "samples": 64}


@pytest.fixture
def root(tmp_path):
    """A root with the module and one trained run of Plain (trained here, in-process)."""
    (tmp_path / "boundary.py").write_text(MODULE)
    plain = load_registry(["boundary.py"], tmp_path)["Plain"]
    Nitro(plain(**FAST), run_dir=tmp_path / "runs" / "Plain").train()
    return tmp_path


def _api_metrics(root):
    plain = load_registry(["boundary.py"], root)["Plain"]
    n = Nitro(plain(**FAST), run_dir=root / "runs" / "Plain", weights="latest => latest")
    return n.evaluate("val")


async def _validate(client, root, experiment):
    args = {"experiment": experiment, "run_dir": "runs/Plain", "weights": "latest => latest",
            "wait_s": 60}  # fmt: skip
    return await ended(client, await call(client, "nitro_validate", **args), root)


def test_a_validation_is_the_same_warm_cold_and_through_the_api_whatever_ran_before(root):
    async def main(warm):
        server = build_server(root, experiment_modules=("boundary.py",), warm_worker=warm)
        async with Client(server) as client:
            if not warm:
                return [await _validate(client, root, "Plain")]
            seen = [await _validate(client, root, "Plain")]
            for polluter in POLLUTERS:
                await _validate(client, root, polluter)  # may fail: its own business
                seen.append(await _validate(client, root, "Plain"))
            return seen

    warm = anyio.run(main, True)
    cold = anyio.run(main, False)
    api = _api_metrics(root)
    clean = {"env": 0.0, "cwd": 0.0, "kept": 0.0, "dtype64": 0.0}
    assert {k: api[k] for k in clean} == clean
    for after, (err, reply) in zip(["nothing", *POLLUTERS], warm + cold, strict=False):
        assert not err and reply["state"] == "succeeded", (after, reply)
        assert reply["metrics"] == api, f"after {after}: {reply['metrics']} != {api}"
    assert cold[0][1]["metrics"] == api  # a worker of its own


def test_experiment_code_that_ends_its_process_never_ends_the_server(root):
    pid = os.getpid()
    record = f"runs/Plain/{read_manifest(root / 'runs' / 'Plain')[-1].file}"

    async def main():
        server = build_server(root, experiment_modules=("boundary.py",))
        async with Client(server) as client:
            replies = {}
            for bad in HOSTILE:
                replies[bad] = await _validate(client, root, bad)
                err, job = await call(client, "nitro_train", experiment=bad,
                                      run_dir=f"runs/{bad}", weights=record,
                                      overrides=FAST)  # fmt: skip
                assert not err, job  # the server could not tell the misfit: the job will
                listed = await client.call_tool("nitro_experiments", {"name": bad})
                assert not listed.is_error  # build_data, monitor(): asked of a child
                assert listed.structured_content["experiments"][0]["splits"] == ["train", "val"]
            after = await _validate(client, root, "Plain")
            return replies, after

    replies, (err, after) = anyio.run(main)
    assert os.getpid() == pid  # still here: the test process is the server
    for bad, (e, reply) in replies.items():
        assert not e and reply["state"] == "failed", (bad, reply)
    assert "exit code 3" in replies["Exits"][1]["error"]
    assert "killed by signal 11" in replies["Segfaults"][1]["error"]
    assert "SystemExit: the experiment's own exit" in replies["RaisesSystemExit"][1]["error"]
    assert not err and after["state"] == "succeeded" and after["metrics"] == _api_metrics(root)


def test_a_question_imports_only_the_modules_that_imported_in_the_server(tmp_path):
    """A module that failed (or hung past the time limit) in the server registers nothing,
    so the process a question is asked in does not import it again (a hanging one would hold
    the call for the question's whole bound)."""
    (tmp_path / "fails.py").write_text(
        "import os\nopen(f'imported-{os.getpid()}', 'w').close()\nraise RuntimeError('broken')\n"
    )
    (tmp_path / "fine.py").write_text(
        "from nitro_core.examples import Regression\n\n\nclass Fine(Regression):\n    pass\n"
    )

    async def main():
        server = build_server(tmp_path, experiment_modules=("fails.py", "fine.py"))
        async with Client(server) as client:
            return await client.call_tool("nitro_experiments", {"name": "Fine"})

    listed = anyio.run(main)
    assert not listed.is_error
    assert listed.structured_content["experiments"][0]["splits"] == ["train", "val"]  # asked
    markers = sorted(p.name for p in tmp_path.glob("imported-*"))
    assert markers == [f"imported-{os.getpid()}"], markers  # the server's import alone
