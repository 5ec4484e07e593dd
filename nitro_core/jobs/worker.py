"""The worker: ``python -m nitro_core.jobs.worker <job_dir>`` runs one job and records its
progress, result or error in the job's files. SIGTERM asks for a graceful stop (the epoch
finishes, validates and checkpoints); SIGKILL leaves the run resumable with resume="auto"."""

from __future__ import annotations

import logging
import os
import signal
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any

from nitro_core.jobs.files import JobSpec, append_event, process_start, read_spec
from nitro_core.jobs.status import update_status, update_status_if
from nitro_core.manifest import now_iso

log = logging.getLogger("nitro.worker")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    directory = Path(args[0])
    spec = read_spec(directory)
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s: %(message)s"
    )
    stop = _Stop()
    signal.signal(signal.SIGTERM, stop.handle)
    me = update_status_if(
        directory,
        {"running"},
        phase="starting",
        pid=os.getpid(),
        pid_start=process_start(os.getpid()),
    )
    if me is None or me.stop_requested:  # stopped (or declared lost) before it could start
        if me is not None:
            update_status(directory, state="stopped", phase="cancelled", ended=now_iso())
        return 0
    append_event(directory, {"time": now_iso(), "event": "started"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result, state = _run(spec, directory, stop)
        except _StoppedEarly:
            update_status(directory, state="stopped", phase="cancelled", ended=now_iso())
            append_event(directory, {"time": now_iso(), "event": "stopped"})
            return 0
        except Exception as exc:  # every failure is recorded; the worker is the edge
            from nitro_core.errors import NitroError

            known = isinstance(exc, NitroError)
            traceback.print_exc(file=sys.stderr)
            update_status(
                directory,
                state="failed",
                phase="failed",
                error=str(exc) if known else f"{type(exc).__name__}: {exc}",
                hint=_hint(exc, spec),
                ended=now_iso(),
                result={"warnings": _warnings(caught)},
            )
            append_event(directory, {"time": now_iso(), "event": "failed", "error": str(exc)})
            return 1
    result["warnings"] = _warnings(caught)
    update_status(directory, state=state, phase="done", result=result, ended=now_iso())
    append_event(directory, {"time": now_iso(), "event": state})
    return 0


class _StoppedEarly(BaseException):  # noqa: N818 - a control-flow signal, not an error
    """SIGTERM arrived before training started: there is no epoch to finish."""


class _Stop:
    """SIGTERM before the handle exists stops at once; afterwards it asks for a graceful stop."""

    def __init__(self) -> None:
        self.handle_ref: Any = None
        self.requested = False

    def handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        if self.handle_ref is not None:
            self.handle_ref.request_stop()
        else:
            raise _StoppedEarly


def _experiment(spec: JobSpec) -> Any:
    from nitro_core.registry import load_registry, lookup

    cls = lookup(load_registry(spec.experiment_modules), spec.experiment)
    return cls(**spec.overrides)


def _run(spec: JobSpec, directory: Path, stop: _Stop) -> tuple[dict[str, Any], str]:
    from nitro_core import Nitro, average_checkpoints, read_manifest

    if spec.kind == "average":
        saved = Path(spec.save) if spec.save else None
        update_status(directory, phase="averaging")
        averaged = average_checkpoints(spec.run_dir, spec.source, save=saved)
        result: dict[str, Any] = {
            "averaged_from": averaged.averaged_from,
            "saved": str(saved) if saved else None,
        }
        if spec.validate_average:
            update_status(directory, phase="validating")
            n = Nitro(
                _experiment(spec),
                run_dir=spec.run_dir,
                weights=saved if saved else spec.source,
                device=spec.device,
            )
            result["metrics"] = n.evaluate(spec.split)
        return result, "succeeded"
    exp = _experiment(spec)
    if spec.kind == "validate":
        update_status(directory, phase="loading")
        n = Nitro(
            exp,
            run_dir=spec.run_dir,
            weights=spec.weights,
            load_ema=spec.load_ema,
            strict=spec.strict,
            device=spec.device,
        )
        update_status(directory, phase="validating")
        metrics = n.evaluate(spec.split)
        return {
            "metrics": metrics,
            "split": spec.split,
            "checkpoint": str(n.checkpoint_source),
            "averaged_from": n.averaged_from,
        }, "succeeded"
    update_status(directory, phase="setup")
    n = Nitro(
        exp,
        run_dir=spec.run_dir,
        seed=spec.seed,
        resume=spec.resume,
        weights=spec.weights,
        restore_best=spec.restore_best,
        restore_optimizer=spec.restore_optimizer,
        strict=spec.strict,
        device=spec.device,
    )
    stop.handle_ref = n
    if stop.requested:
        n.request_stop()
    update_status(
        directory,
        phase="training",
        run_id=n.run_id,
        max_epochs=exp.max_epochs,
        epoch=n.epoch,
        step=n.step,
    )

    log.info(
        "run %s in %s: setup done at epoch %d, training to %d",
        n.run_id,
        spec.run_dir,
        n.epoch,
        exp.max_epochs,
    )

    def on_epoch(row: dict[str, Any]) -> None:
        log.info(
            "epoch %d step %d train_loss=%.6g val=%s",
            row["epoch"],
            row["step"],
            row["train_loss"],
            row["val"],
        )
        update_status(
            directory,
            epoch=row["epoch"],
            step=row["step"],
            last_loss=row["train_loss"],
            last_val=row["val"],
        )
        append_event(directory, {"time": now_iso(), "event": "epoch", **row})

    n.train(on_epoch=on_epoch)
    kept = [e.model_dump() for e in read_manifest(n.run_dir) if e.run == n.run_id]
    result = {
        "run_id": n.run_id,
        "stop_reason": n.stop_reason,
        "epoch": n.epoch,
        "step": n.step,
        "final_val": n.history[-1]["val"] if n.history else {},
        "kept": [e["file"] for e in kept][-20:],  # responses stay bounded; nitro_manifest pages
        "kept_total": len(kept),
        "checkpoint_source": str(n.checkpoint_source) if n.checkpoint_source else None,
    }
    return result, "stopped" if n.stop_reason == "requested" else "succeeded"


def _warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    """At most 20 distinct warnings of at most 500 characters each."""
    texts = list(dict.fromkeys(str(w.message) for w in caught))[:20]
    return [t if len(t) <= 500 else t[:497] + "..." for t in texts]


def _hint(exc: Exception, spec: JobSpec) -> str:
    from nitro_core.errors import CheckpointCorrupt, MonitorError, NitroError

    if isinstance(exc, MonitorError):
        return "Fix the metric or learning rate, then call nitro_train again with resume='auto'."
    if isinstance(exc, CheckpointCorrupt):
        return "Pick another checkpoint: nitro_manifest lists them."
    if isinstance(exc, NitroError):
        return "The error says what to write instead; call again with it."
    return "An unexpected error: the log tail holds the traceback. The run stays resumable with resume='auto'."


if __name__ == "__main__":
    raise SystemExit(main())
