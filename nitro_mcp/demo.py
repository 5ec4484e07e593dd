"""``nitro demo``: start the server as a subprocess and drive it over stdio, as an agent
would, printing each call and a compact result."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters


def _show(name: str, args: dict[str, Any], result: Any) -> dict[str, Any]:
    print(f"\n> {name}({', '.join(f'{k}={v!r}' for k, v in args.items())})")
    if result.is_error:
        print(f"  error: {result.content[0].text}")
        return {}
    data = result.structured_content or {}
    print("  " + json.dumps(_compact(data), default=str)[:600])
    return data


def _compact(data: Any) -> Any:
    if isinstance(data, dict):
        return {
            k: _compact(v)
            for k, v in data.items()
            if k not in ("log_tail", "next", "fields") and v not in (None, [], {})
        }
    if isinstance(data, list):
        return [_compact(v) for v in data[:6]] + (["..."] if len(data) > 6 else [])
    if isinstance(data, float):
        return round(data, 4)
    return data


async def run_demo(root: Path, epochs: int) -> int:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "nitro_mcp.cli", "serve", "--root", str(root)],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    print(f"Starting `nitro serve --root {root}` and talking to it over stdio (JSON-RPC) ...")
    async with Client(params) as client:

        async def call(name: str, progress: Any = None, **args: Any) -> dict[str, Any]:
            result = await client.call_tool(name, args, progress_callback=progress)
            return _show(name, args, result)

        tools = await client.list_tools()
        print(f"Tools: {', '.join(t.name for t in tools.tools)}")
        exps = await call("nitro_experiments")
        print("  experiments: " + ", ".join(e["name"] for e in exps.get("experiments", [])))
        job = await call(
            "nitro_train",
            experiment="Classifier",
            run_dir="runs/Classifier",
            overrides={"max_epochs": epochs},
        )
        if not job:
            return 1

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            print(f"    progress {progress:g}/{total or '?'}: {message}")

        status: dict[str, Any] = {}
        while status.get("state") not in ("succeeded", "failed", "stopped", "lost"):
            status = await call("nitro_status", on_progress, job_id=job["job_id"], wait_s=20)
        if status["state"] != "succeeded":
            print(status.get("log_tail", ""))
            return 1

        async def follow(reply: dict[str, Any]) -> dict[str, Any]:
            """A validation or average followed to its end: its result, as the reply holds it."""
            while reply.get("state") in ("queued", "running"):
                args = {"job_id": reply["job_id"], "wait_s": 25, "until": "end", "brief": True}
                await call("nitro_status", **args)
                done = await client.call_tool("nitro_status", {"job_id": reply["job_id"]})
                full = done.structured_content or {}
                reply = {**reply, "state": full.get("state"), **(full.get("result") or {})}
            return reply

        best = await follow(
            await call(
                "nitro_validate",
                experiment="Classifier",
                run_dir="runs/Classifier",
                weights="latest => best",
            )
        )
        save = f"runs/Classifier/avg3-{status['run_id']}.safetensors"
        avg = await follow(
            await call(
                "average", run_dir="runs/Classifier", source="latest => Average(Last(3))", save=save
            )
        )
        averaged: dict[str, Any] = {}
        if avg.get("saved"):
            averaged = await follow(
                await call(
                    "nitro_validate",
                    experiment="Classifier",
                    run_dir="runs/Classifier",
                    weights=avg["saved"],
                )
            )
        print(comparison(best.get("metrics"), averaged.get("metrics")))
        await call("nitro_runs", run_dir="runs/Classifier")
        final = (
            await client.call_tool("nitro_status", {"job_id": job["job_id"]})
        ).structured_content
        print(f"\nRun {final['run_id']} keeps, and why:")
        for kept in final["kept"]:
            print(f"  {kept['file']}  <- {'; '.join(kept['kept_by']) or '-'}")
    print(
        "\nDone. The job, its run and its checkpoints stay on disk: `nitro runs runs/Classifier`."
    )
    return 0


def comparison(best: dict[str, float] | None, averaged: dict[str, float] | None) -> str:
    """The demo's payoff: the best checkpoint's validation metrics beside the average's."""
    if not best or not averaged:
        return "\nNo comparison: a validation did not finish (see its error above)."
    lines = ["\nValidation, the best checkpoint against the average of the last 3:"]
    for name in sorted(set(best) & set(averaged)):
        delta = averaged[name] - best[name]
        lines.append(
            f"  {name:<10} best {best[name]:.4f}   average {averaged[name]:.4f}   ({delta:+.4f})"
        )
    return "\n".join(lines)


def main(root: Path, epochs: int) -> int:
    return anyio.run(run_demo, root, epochs)
