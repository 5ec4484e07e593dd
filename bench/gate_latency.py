"""The gate's cost to an agent: one evaluation end to end, and the server's start-up.

Measures, in one run on this machine:
- `nitro_validate` of a tiny record (Regression, 1 epoch of 64 samples) through a
  `nitro serve` stdio subprocess that is already up, from the call to the reply holding its
  metrics (`wait_s=60`); median of --runs calls after a first one (which starts the warm
  worker); and the same with `--no-warm-worker` (a worker of its own for each: the cold path);
- baseline: a plain Python process that imports torch, loads the same record's weights with
  safetensors, builds the model and evaluates the validation split, started fresh each
  time (what a script would do); median of --runs; the ratio gate / plain process (the
  issue's target for a warm worker: at most 0.5x);
- start-up: from starting `nitro serve` to its `tools/list` reply (initialize first, as a
  client does), against `python -c "import mcp"` (target: within 2x).

Run from the repository root: python bench/gate_latency.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

REPO = Path(__file__).resolve().parent.parent
TINY = {"max_epochs": 1, "samples": 64}
PLAIN = """
import sys, time
import torch
from safetensors.torch import load_file
from nitro_core.examples import Regression
exp = Regression(max_epochs=1, samples=64)
model = exp.build_model()
state = load_file(sys.argv[1])
weights = {k.split("/", 1)[1]: v for k, v in state.items() if k.startswith(("params/", "buffers/"))}
model.load_state_dict(weights)
model.eval()
total, count = 0.0, 0
with torch.no_grad():
    for batch in exp.build_data()["val"]:
        total += float(torch.nn.functional.mse_loss(model(batch["x"]), batch["y"], reduction="sum"))
        count += len(batch["y"])
print(total / count)
"""


def server(root: Path, warm: bool = True) -> StdioServerParameters:
    extra = [] if warm else ["--no-warm-worker"]
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "nitro_mcp.cli", "serve", "--root", str(root), *extra],
        cwd=str(REPO),
    )  # fmt: skip


def record(root: Path) -> Path:
    """A tiny trained record under ``root`` (trained in this process)."""
    from nitro_core import Nitro, read_manifest
    from nitro_core.examples import Regression

    run_dir = root / "runs" / "Regression"
    Nitro(Regression(**TINY), run_dir=run_dir).train()
    return run_dir / read_manifest(run_dir)[-1].file


async def gate_validations(root: Path, runs: int, warm: bool = True) -> list[float]:
    """Seconds of each of ``runs`` validations through one server, after a first one (which
    starts the warm worker) not counted."""
    out = []
    async with Client(server(root, warm)) as client:
        for _ in range(runs + 1):
            start = time.perf_counter()
            result = await client.call_tool("nitro_validate", {
                "experiment": "Regression", "weights": "latest => latest", "wait_s": 60,
            })  # fmt: skip
            took = time.perf_counter() - start
            reply = result.structured_content or {}
            assert not result.is_error and reply.get("metrics"), result.content
            out.append(took)
    return out[1:]


def plain_validations(path: Path, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", PLAIN, str(path)], check=True, cwd=REPO,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        out.append(time.perf_counter() - start)
    return out


async def listing_once(root: Path) -> float:
    start = time.perf_counter()
    async with Client(server(root)) as client:
        tools = (await client.list_tools()).tools
        took = time.perf_counter() - start
        assert tools
    return took


def import_mcp() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import mcp"], check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path = record(root)
        gate = anyio.run(gate_validations, root, args.runs)
        cold = anyio.run(gate_validations, root, args.runs, False)
        plain = plain_validations(path, args.runs)
        listings = [anyio.run(listing_once, root) for _ in range(args.runs)]
        imports = [import_mcp() for _ in range(args.runs)]
    g, p, c = statistics.median(gate), statistics.median(plain), statistics.median(cold)
    s, m = statistics.median(listings), statistics.median(imports)
    print(
        f"nitro_validate through the gate: median {g:.2f} s (min {min(gate):.2f}, max {max(gate):.2f})"
    )
    print(f"plain process (import torch, load, evaluate): median {p:.2f} s")
    print(f"  ratio gate / plain: {g / p:.2f}x (target: <= 0.5x)")
    print(f"nitro_validate with a worker of its own (--no-warm-worker): median {c:.2f} s; "
          f"warm / cold {g / c:.2f}x")  # fmt: skip
    print(f"nitro serve start to tools/list: median {s:.2f} s")
    print(f"python -c 'import mcp': median {m:.2f} s")
    print(f"  ratio serve / import mcp: {s / m:.2f}x (target: <= 2x)")


if __name__ == "__main__":
    main()
