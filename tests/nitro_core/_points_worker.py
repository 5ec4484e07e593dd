"""Worker process for the SIGKILL tests of test_mid_epoch_resume.py: trains ``Steps`` with a
checkpoint point every few steps and asynchronous writes, resuming with ``resume='auto'``.

    python _points_worker.py RUN_DIR --split tensor|plain|stateful2 [--resume auto|false]
        [--slow-write S] [--hold PATH] [--ready PATH] [--out PATH]

``--slow-write``: each record write sleeps S seconds after its ``.tmp`` is claimed (a slow
disk), so that a kill lands mid-write often. ``--hold``: wait for this file before touching
the run directory. ``--ready``: touched once the handle is set up. ``--out``: the final
state (parameters, optimizer tensors, torch generator) as safetensors, with the step, the
param groups, the scheduler and the history (bar seconds) as JSON metadata.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script

from nitro_core import Nitro  # noqa: E402
from nitro_core.store import recordio  # noqa: E402
from tests.nitro_core.steps import Steps  # noqa: E402


def experiment(split: str) -> Steps:
    """~6 MB records (a 1024-wide hidden layer with AdamW); 32 batches an epoch, a point
    every 4 steps (8 an epoch), 4 epochs."""
    return Steps(
        split=split, rows=256, batch=8, width=512, hidden=1024, every=4, keep=2, max_epochs=4
    )


def slow_writes(seconds: float) -> None:
    real = recordio.write_record

    def write_record(target, tensors, meta):
        time.sleep(seconds)
        return real(target, tensors, meta)

    recordio.write_record = write_record


def save_final(n: Nitro, out: Path) -> None:
    tensors = {f"model/{k}": v.detach().contiguous() for k, v in n.model.state_dict().items()}
    state = n.optimizer.state_dict()
    for idx, slots in state["state"].items():
        for key, value in slots.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim/{idx}/{key}"] = value.detach().contiguous()
    tensors["rng/torch"] = torch.get_rng_state()
    history = [{k: v for k, v in row.items() if k != "seconds"} for row in n.history]
    meta = {
        "step": str(n.step),
        "epoch": str(n.epoch),
        "param_groups": json.dumps(state["param_groups"], sort_keys=True),
        "scheduler": json.dumps(n.scheduler.state_dict(), sort_keys=True),
        "history": json.dumps(history),
    }
    save_file(tensors, str(out), metadata=meta)


def wait_for(path: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            sys.exit(f"worker: {path} did not appear within {timeout:.0f} s")
        time.sleep(0.002)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("run_dir", type=Path)
    p.add_argument("--split", choices=("tensor", "plain", "stateful2"), required=True)
    p.add_argument("--resume", choices=("auto", "false"), default="auto")
    p.add_argument("--slow-write", type=float, default=0.0)
    p.add_argument("--hold", type=Path)
    p.add_argument("--ready", type=Path)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)

    torch.set_num_threads(1)  # the same arithmetic in every process
    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])  # warm lazy imports before --hold
    warnings.simplefilter("ignore")  # resume='auto' on an empty directory, leftovers, replays
    if args.slow_write:
        slow_writes(args.slow_write)
    if args.hold is not None:
        wait_for(args.hold)
    resume = "auto" if args.resume == "auto" else False
    n = Nitro(experiment(args.split), run_dir=args.run_dir, resume=resume)
    if args.ready is not None:
        args.ready.touch()
    n.train()
    if args.out is not None:
        save_final(n, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
