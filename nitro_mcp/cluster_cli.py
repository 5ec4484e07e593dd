"""``nitro train EXP --executor slurm``: the call checked by the gate as a tool call is,
submitted to the cluster, and followed from the terminal until the job ends (its state
changes and epochs on stderr; the end's JSON on stdout). Ctrl+C asks the job to stop
gracefully and keeps following it."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from nitro_core.errors import NitroError
from nitro_core.jobs.call_models import TrainCall
from nitro_core.jobs.files import TERMINAL
from nitro_mcp.gate import Gate
from nitro_mcp.tools.training_tools import train

POLL_S = 1.0


def train_on_cluster(call: TrainCall, args: argparse.Namespace) -> int:
    gate = Gate(Path("."), experiment_modules=tuple(args.experiment_module), executor="slurm")
    try:
        handle = train(gate, call)
    except NitroError as exc:
        print(f"nitro train: {exc}", file=sys.stderr)
        return 2
    job_id = handle.job_id
    print(f"nitro train: job {job_id} submitted to Slurm", file=sys.stderr)
    seen: tuple[object, ...] = ()
    while True:
        try:
            status = gate.jobs.status(job_id)
            now = (status.state, status.phase, status.epoch, status.slurm_id)
            if now != seen:
                seen = now
                engine = status.engine
                said = f" (Slurm {engine.state} per {engine.source})" if engine else ""
                print(f"nitro train: {status.state} {status.phase} epoch {status.epoch}{said}",
                      file=sys.stderr)  # fmt: skip
            if status.state in TERMINAL:
                break
            time.sleep(POLL_S)
        except KeyboardInterrupt:
            gate.jobs.stop(job_id)
            print("nitro train: stop requested; the run stops at its next point", file=sys.stderr)
    print(json.dumps({"job_id": job_id, "state": status.state, "result": status.result,
                      "error": status.error}))  # fmt: skip
    return 0 if status.state in ("succeeded", "stopped") else 1
