"""A whole agent session over stdio against `nitro serve`, as an LLM agent drives it: a user
module given by file path, training followed with until='end', history, plot, compare,
delete (dry run, then for real), validation with the record's own config. Every reply's
text stays under the 8,000-character bound."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import anyio
import pytest
from mcp import Client, StdioServerParameters

from nitro_core import checkpoint_info, read_manifest

from .conftest import ended

BOUND = 8000

MODULE = textwrap.dedent(
    """
    import torch
    from nitro_core import Best, Checkpointer, Experiment, Host, Last, TensorBatches


    class Line(Experiment):
        samples: int = 128
        hidden: int = 8
        lr: float = 0.05
        max_epochs: Host[int] = 2

        def build_data(self):
            g = torch.Generator().manual_seed(0)
            x = torch.randn(self.samples, 3, generator=g)
            y = x.sum(1, keepdim=True)
            cut = self.samples * 3 // 4
            return {
                "train": TensorBatches({"x": x[:cut], "y": y[:cut]}, 16, shuffle=True),
                "val": TensorBatches({"x": x[cut:], "y": y[cut:]}, 16),
            }

        def build_model(self):
            return torch.nn.Sequential(
                torch.nn.Linear(3, self.hidden), torch.nn.Tanh(), torch.nn.Linear(self.hidden, 1)
            )

        def loss(self, model, batch):
            return torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])

        def checkpointer(self):
            return Checkpointer(keep=(Best(2), Last(2)))
    """
)


@pytest.mark.slow  # two real trainings and a validation through stdio workers
def test_an_agent_session_over_stdio_stays_within_the_reply_bound(tmp_path):
    (tmp_path / "exps").mkdir()
    (tmp_path / "exps" / "line.py").write_text(MODULE)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "nitro_mcp.cli", "serve", "--root", str(tmp_path), "--experiment-module", "exps/line.py"],
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},  # as MCP clients do
    )  # fmt: skip
    replies: list[tuple[str, str]] = []

    async def call(client, name, **args):
        result = await client.call_tool(name, args)
        text = "".join(getattr(c, "text", "") for c in result.content)
        replies.append((name, text))
        assert not result.is_error, (name, text)
        return result.structured_content

    async def session():
        async with Client(params) as client:
            listing = await call(client, "nitro_experiments")
            assert "Line" in json.dumps(listing)
            runs = []
            for hidden in (8, 16):
                job = await call(client, "nitro_train", experiment="Line", run_dir=f"runs/h{hidden}",
                                 overrides={"hidden": hidden, "samples": 160})  # fmt: skip
                with anyio.fail_after(120):
                    status = await call(client, "nitro_status", job_id=job["job_id"], wait_s=25,
                                        until="end", brief=True)  # fmt: skip
                    while status["state"] in ("queued", "running"):
                        status = await call(client, "nitro_status", job_id=job["job_id"],
                                            wait_s=25, until="end", brief=True)  # fmt: skip
                assert status["state"] == "succeeded", status
                runs.append(f"runs/h{hidden}")
            history = await call(client, "nitro_history", run_dir="runs/h8")
            assert history["total_rows"] == 2
            plot = await client.call_tool("nitro_plot", {"run_dir": "runs/h8"})
            assert not plot.is_error and any(c.type == "image" for c in plot.content)
            assert plot.structured_content is None
            compare = await call(client, "nitro_compare", sources=runs)
            assert "hidden" in json.dumps(compare)
            listed = await call(client, "nitro_runs")
            assert {"runs/h8", "runs/h16"} <= {r["run_dir"] for r in listed["run_dirs"]}
            # the record's own config: no override repeated, and the metrics are the recorded ones
            _, val = await ended(client, (False, await call(client, "nitro_validate", experiment="Line",
                                  run_dir="runs/h16", weights="latest => latest", wait_s=60)))  # fmt: skip
            assert val["state"] == "succeeded", val
            run = history["run"]
            dry = await call(client, "nitro_delete", run_dir="runs/h8", run=run)
            assert (
                dry["dry_run"]
                and dry["files"]
                and list((tmp_path / "runs/h8").glob("*.safetensors"))
            )
            gone = await call(client, "nitro_delete", run_dir="runs/h8", run=run, dry_run=False)
            assert gone["files"] and not list((tmp_path / "runs/h8").glob("*.safetensors"))
            return val

    val = anyio.run(session)
    latest = read_manifest(tmp_path / "runs/h16")[-1]
    recorded = checkpoint_info(tmp_path / "runs/h16" / latest.file)["metrics"]
    assert val["metrics"] == pytest.approx(recorded, rel=1e-6)
    too_long = [(name, len(text)) for name, text in replies if len(text) >= BOUND]
    assert too_long == []
    assert len(replies) >= 10
