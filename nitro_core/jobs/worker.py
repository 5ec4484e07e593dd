"""The worker: ``python -m nitro_core.jobs.worker <job_dir>`` runs one job and records its
progress, result or error in the job's files.

A stop is a flag, never an exception raised into running code: SIGTERM (or the
``stop_requested`` field the server sets in ``status.json``) is read at safe points. Before
training starts, a requested stop ends the job as ``stopped`` without touching the run;
during training it asks the handle for a graceful stop (the epoch finishes, validates and
checkpoints). SIGKILL leaves the run resumable with resume="auto". A worker that ends
starts the next queued job, so the queue drains with no server attached.

``python -m nitro_core.jobs.worker --warm`` is the warm worker (:func:`warm`): a fork
server that has imported torch and Nitro once and runs each evaluation job (validate,
average) the server's executor hands over in a child ``fork()``ed for it, one after another,
so jobs start warm and leave nothing behind for the next."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nitro_core.errors import (
    CheckpointCorrupt,
    MonitorError,
    NitroError,
    NonFiniteLoss,
    UnsafePath,
    parts_to_json,
)
from nitro_core.jobs import rank_launch
from nitro_core.jobs.call_models import AverageCall, TrainCall, ValidateCall
from nitro_core.jobs.calls import nothing_to_train, spec_arguments
from nitro_core.jobs.files import (
    EpochProgress,
    Failure,
    JobSpec,
    append_event,
    note_event,
    open_log,
    process_start,
    read_spec,
    read_status,
)
from nitro_core.jobs.manager import JobManager
from nitro_core.jobs.status import compare_and_set, update_status, update_status_if
from nitro_core.store.atomic import Replace
from nitro_core.store.listing import read_manifest
from nitro_core.store.manifest import now_iso

if TYPE_CHECKING:
    from nitro_core.training.progress import Snapshot

log = logging.getLogger("nitro.worker")
WATCH_S = 0.25  # how often the stop watcher looks at the flags


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--warm"]:
        return warm(0)
    rank = args[:1] == ["--rank"]  # one rank of a several-process job (jobs.rank_launch)
    directory = Path(args[1] if rank else args[0])
    spec = read_spec(directory)
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s: %(message)s"
    )
    stop = _Stop(directory)
    signal.signal(signal.SIGTERM, stop.handle)
    if rank:
        return _rank(spec, directory, stop)
    try:
        return _main(spec, directory, stop)
    finally:
        stop.done.set()  # its watcher ends with the job (a warm worker runs the next)
        if not _on_cluster(spec):  # a cluster's scheduler starts the next one there
            _pump_queue(directory, spec)


def warm(fd: int) -> int:
    """The fork server (DESIGN section 16): each evaluation job whose directory arrives on
    ``fd`` (its stdin, one line each, from the server's executor) runs in a process
    ``fork()``ed from this one for it, and so does each question the server asks of an
    experiment's code (a line of JSON, :mod:`nitro_core.jobs.probe`). This process imports
    torch and Nitro once (:func:`_preload`) and does nothing else with them: it never
    initializes CUDA, runs no tensor operation and imports no experiment. Each child imports
    the experiment modules itself, and a job's child writes to the job's log, records the
    job's end and exits, so whatever a job changes (a patched function or class, torch's
    defaults, the environment, the working directory, memory it kept) dies with it and the
    next job starts warm and clean. Children are reaped as they end (the executor hands
    over one job at a time; questions may come meanwhile). It ends when the server closes
    its end, never while a job could still arrive."""
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s: %(message)s"
    )
    _preload()
    # a SIGTERM meant for a job that was handed over but has no process of its own yet: the
    # job's flag in status.json reaches its child at the child's first safe point
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    woken, wake = os.pipe()  # a child's end wakes the loop at once (SIGCHLD writes here)
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    children: dict[int, tuple[str, Path]] = {}  # pid -> ("job", its directory) or a question
    jobs = 0
    for line in _lines(fd, lambda: _reap(children, block=False), woken):
        if line.startswith("{"):
            kind, path = "probe", Path(json.loads(line)["answer"])
        else:
            jobs += 1
            kind, path = "job", Path(line)
        child = os.fork()
        if child == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.close(woken)
            os.close(wake)
            if kind == "probe":
                _forked_probe(json.loads(line))  # never returns
            _forked_job(path, jobs)  # never returns
        with contextlib.suppress(OSError):
            os.setpgid(child, child)  # as the child does: whichever runs first
        children[child] = (kind, path)
        if kind == "job":
            _own_pid(path, child)
    _reap(children, block=True)  # the job in hand finishes first
    return 0


def _reap(children: dict[int, tuple[str, Path]], block: bool) -> None:
    """Collect the children that ended (all of them, waiting, with ``block``): a job whose
    process ended without recording its end is recorded as failed with how it ended (a
    SIGKILL from outside is left for the executor, which finds the job lost); a question
    whose process died gets an empty answer, so the server does not wait for it."""
    while children:
        pid, code = os.waitpid(-1, 0 if block else os.WNOHANG)
        if pid == 0:
            return
        kind, path = children.pop(pid, ("?", Path()))
        how = _ended(code)
        log.info("%s %s: its process %d ended (%s)", kind, path.name, pid, how)
        if kind == "probe" and not path.exists():
            with contextlib.suppress(OSError):
                Replace(path).commit(lambda f: f.write(b"{}"))
        elif kind == "job" and not (os.WIFSIGNALED(code) and os.WTERMSIG(code) == signal.SIGKILL):
            with contextlib.suppress(Exception):
                compare_and_set(
                    path, lambda s: s.state == "running" and not s.stop_requested,
                    state="failed", phase="failed", ended=now_iso(),
                    error=f"The job's process ended ({how}) before it could record an end: "
                    "the experiment's code ended it (os._exit, sys.exit, a crash). Its log "
                    "holds what it printed.", failure="unexpected",
                )  # fmt: skip


def _preload() -> None:
    """What every evaluation job imports, imported once in the fork server: torch, the
    handle, averaging and the registry (no experiment module, no tensor operation), and
    ``torch._dynamo``, which building an optimizer imports (measured: 1.3 to 2.7 s of each
    forked job without it, 40 ms with it)."""
    import torch  # noqa: F401

    with contextlib.suppress(ImportError):
        import torch._dynamo  # noqa: F401

    import nitro_core.averaging  # noqa: F401  # lazy: the fork server's preload
    import nitro_core.registry  # noqa: F401  # lazy: the fork server's preload
    import nitro_core.training.from_record  # noqa: F401  # lazy: the fork server's preload
    import nitro_core.training.handle  # noqa: F401  # lazy: the fork server's preload


def _forked_job(directory: Path, count: int) -> None:
    """The child the fork server made for one job: in a process group of its own (a forced
    stop kills it, not the server), its stdin closed (the server's lines are the parent's),
    SIGTERM its own again; runs the job as a worker of its own would (:func:`main`) and
    exits, never returning into the server's loop."""
    code = 1
    try:
        os.setpgid(0, 0)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        try:
            with _job_output(directory):
                log.info(
                    "job %s: run by the warm worker %d (its job %d) in process %d",
                    directory.name, os.getppid(), count, os.getpid(),
                )  # fmt: skip
                code = main([str(directory)])
        except UnsafePath as exc:  # its log.txt is a link: failed, as a worker's start is
            update_status_if(
                directory, {"running"}, state="failed", phase="failed", ended=now_iso(),
                error=str(exc), hint="Remove the link, then submit the job again.",
            )  # fmt: skip
        except BaseException as exc:  # before the job could record anything: it fails here
            log.exception("job %s could not run here", directory.name)
            update_status_if(
                directory, {"running"}, state="failed", phase="failed", ended=now_iso(),
                error=f"The warm worker could not run the job: {_error_text(exc)}",
            )  # fmt: skip
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _forked_probe(request: dict[str, Any]) -> None:
    """The child the fork server made for a question: its own process group, stdin and
    stdout closed (the operator's prints go nowhere), the answer written, then exit."""
    code = 1
    try:
        os.setpgid(0, 0)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1):
            os.dup2(null, fd)
        os.close(null)
        from nitro_core.jobs.probe import Question, write_answer  # lazy: a probe child's

        question = Question.model_validate_json(Path(request["question"]).read_bytes())
        write_answer(question, Path(request["answer"]))
        code = 0
    finally:
        os._exit(code)


def _own_pid(directory: Path, child: int) -> None:
    """The job's status names its own process, not the fork server (the executor wrote the
    server's pid when it handed the job over, unless the child reported itself first), so a
    stop reaches the job alone and a child killed before it could report is found lost."""
    server = os.getpid()
    with contextlib.suppress(Exception):  # a job directory gone or damaged: the child says it
        compare_and_set(
            directory, lambda s: s.state == "running" and s.pid in (None, server),
            pid=child, pid_start=process_start(child),
        )  # fmt: skip


def _ended(code: int) -> str:
    if os.WIFSIGNALED(code):
        return f"killed by signal {os.WTERMSIG(code)}"
    return f"exit code {os.waitstatus_to_exitcode(code)}"


def _lines(fd: int, idle: Callable[[], None], woken: int) -> Iterator[str]:
    """The lines arriving on ``fd``, until it closes; ``idle`` is called whenever ``woken``
    has bytes (a child ended) and at least once a second (the fork server reaps then)."""
    pending = b""
    while True:
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.strip():
                yield line.decode().strip()
        idle()
        ready, _, _ = select.select([fd, woken], [], [], 1.0)
        if woken in ready:
            os.read(woken, 4096)
        if fd not in ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return  # the server closed its end
        pending += chunk


@contextlib.contextmanager
def _job_output(directory: Path) -> Iterator[None]:
    """This process's stdout and stderr on the job's log for the block."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        with open_log(directory) as job_log:
            os.dup2(job_log.fileno(), 1)
            os.dup2(job_log.fileno(), 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)


def _rank(spec: JobSpec, directory: Path, stop: _Stop) -> int:
    """One rank of a several-process train job (``python -m nitro_core.jobs.worker --rank
    <job_dir>``, launched by :mod:`nitro_core.jobs.rank_launch`): rank 0 reports as a worker
    does, the others train silently."""
    if int(os.environ.get("RANK", "0")) == 0:
        return _main(spec, directory, stop, rank0=True)
    stop.watch()
    _run(spec, directory, stop, report=False)
    return 0


def _main(spec: JobSpec, directory: Path, stop: _Stop, rank0: bool = False) -> int:
    """Run the job and record its end. ``rank0``: this is rank 0 of a job's
    ``torch.distributed.run`` (:mod:`nitro_core.jobs.rank_launch`): the worker that launched the
    ranks keeps its pid in the status (a forced stop kills its whole process group)."""
    me = (
        update_status_if(directory, {"running"}, phase="starting")
        if rank0
        else update_status_if(
            directory,
            {"queued", "running"} if _on_cluster(spec) else {"running"},
            phase="starting",
            pid=os.getpid(),
            pid_start=process_start(os.getpid()),
            **_claim(spec),
        )
    )
    if me is None or me.stop_requested:  # stopped (or declared lost) before it could start
        if me is not None:
            _end(directory, "stopped", phase="cancelled")
        return 0
    stop.watch()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            append_event(directory, {"time": now_iso(), "event": "started"})  # a link: failed
            outcome = _run(spec, directory, stop, rank0=rank0)
            if outcome is None:  # the ranks recorded the job's end themselves
                return 0
            result, state = outcome
        except _StoppedEarly:
            _end(directory, "stopped", phase="cancelled")
            return 0
        except Exception as exc:  # every failure is recorded; the worker is the edge
            traceback.print_exc(file=sys.stderr)
            _end(
                directory, "failed", phase="failed", error=_error_text(exc),
                refusal=parts_to_json(exc.parts) if isinstance(exc, NitroError) else None,
                failure=_failure(exc), recorded_run=_recorded_run(spec, directory),
                result={"warnings": _warnings(caught)}, detail={"error": str(exc)},
            )  # fmt: skip
            return 1
    result["warnings"] = _warnings(caught)
    _end(directory, state, phase="done", result=result)
    return 0


def _on_cluster(spec: JobSpec) -> bool:
    """Whether the job was submitted to Slurm (then this worker claims it from ``queued``)."""
    return getattr(spec.call, "executor", None) == "slurm"


def _claim(spec: JobSpec) -> dict[str, Any]:
    """What a worker started by the cluster's scheduler writes as it starts."""
    return {"state": "running", "started": now_iso()} if _on_cluster(spec) else {}


def _end(directory: Path, state: str, detail: dict[str, Any] | None = None, **changes: Any) -> None:
    """Record the job's end, unless the server recorded one first (a forced stop)."""
    if update_status_if(directory, {"running"}, state=state, ended=now_iso(), **changes) is None:
        log.info(
            "the job had already ended (%s); this %s is not recorded", _state(directory), state
        )
        return
    note_event(directory, {"time": now_iso(), "event": state, **(detail or {})})


def _state(directory: Path) -> str:
    try:
        return read_status(directory).state
    except (OSError, ValueError):
        return "unknown"


def _pump_queue(directory: Path, spec: JobSpec) -> None:
    """Start the next queued job now that this one's slot is free."""
    try:
        JobManager(
            directory.parent.parent.parent,
            max_jobs=spec.max_jobs,
            max_eval_jobs=spec.max_eval_jobs,
        ).pump()
    except Exception:  # the job's own result is recorded already; a server pumps later
        log.exception("could not start the next queued job")


def _error_text(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, NitroError) else f"{type(exc).__name__}: {exc}"


class _StoppedEarly(BaseException):  # noqa: N818 - a control-flow signal, not an error
    """A stop was requested before training started: there is no epoch to finish."""


class _Stop:
    """The stop flag. The SIGTERM handler only sets it (no exception, no lock: it may land
    anywhere, mid-commit included); ``check`` reads it at safe points, and a watcher thread
    hands it to the training handle as a graceful stop request."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.handle_ref: Any = None
        self.requested = False
        self.done = threading.Event()  # set when the job ends: its watcher ends too

    def handle(self, signum: int, frame: Any) -> None:
        self.requested = True

    def is_requested(self) -> bool:
        """SIGTERM arrived, or the server set ``stop_requested`` in the job's status."""
        if not self.requested:
            try:
                self.requested = read_status(self.directory).stop_requested
            except (OSError, ValueError):
                pass
        return self.requested

    def check(self) -> None:
        """A safe point before training: stop now, touching nothing, when asked to."""
        if self.is_requested():
            raise _StoppedEarly

    def watch(self) -> None:
        threading.Thread(target=self._forward, name="nitro-stop-watcher", daemon=True).start()

    def _forward(self) -> None:
        while not self.done.wait(WATCH_S):
            if self.is_requested() and _state(self.directory) == "stopped":
                os._exit(137)  # a forced stop the server recorded (a scheduler's kill is slow)
            if self.handle_ref is not None and self.is_requested():
                self.handle_ref.request_stop()  # again after train() clears it: idempotent


def _experiment(spec: JobSpec, record: Any = None) -> Any:
    """The job's experiment: built from the config of the record ``record`` names (the
    overrides on top, each difference a warning in the result), else from the defaults."""
    from nitro_core.registry import load_registry, lookup  # lazy: examples import torch
    from nitro_core.training.from_record import experiment_from_record  # lazy: torch

    assert spec.experiment is not None  # the server submits no job needing one without it
    cls = lookup(load_registry(spec.experiment_modules), spec.experiment)
    if record is None:
        return cls(**spec.call.overrides)
    return experiment_from_record(cls, record, spec.run_dir, **spec.call.overrides)


def _average(spec: JobSpec, call: AverageCall, directory: Path, stop: _Stop) -> dict[str, Any]:
    """An average job: :func:`average_job` with the job's experiment, its phases in its
    status, a stop request skipping the validation."""
    return average_job(
        call,
        lambda record: _experiment(spec, record),
        directory / "average.safetensors",
        phase=lambda name: update_status(directory, phase=name),
        stopped=stop.is_requested,
    )


def average_job(
    call: AverageCall,
    experiment_of: Callable[[Path], Any],
    scratch: Path,
    phase: Callable[[str], object] = lambda name: None,
    stopped: Callable[[], bool] = lambda: False,
) -> dict[str, Any]:
    """What ``average`` does, in a worker or in ``nitro average``: the average, validated
    when asked (in ``experiment_of(record)``, from a copy at ``scratch``, so nothing is
    averaged twice), then saved; the saved header carries the average's own validation
    metrics (of the "val" split), or none."""
    from nitro_core import Nitro  # lazy: torch
    from nitro_core.averaging import (  # lazy: torch
        average_checkpoints,
        refuse_new,
        write_averaged,
    )
    from nitro_core.store.place import place  # lazy: with averaging

    saved = call.save  # a path, or an object-store URL
    if saved is not None:
        refuse_new(saved)  # before any record is read
    phase("averaging")
    averaged = average_checkpoints(**call.average_kwargs())
    result: dict[str, Any] = {"averaged_from": averaged.averaged_from, "saved": saved}
    metrics = None
    if call.validate_average and not stopped():  # the average stands either way
        phase("validating")
        scratch.unlink(missing_ok=True)  # left by a killed worker of this job
        write_averaged(averaged, scratch)
        try:
            n = Nitro(experiment_of(scratch), run_dir=call.run_dir, weights=scratch)
            result["metrics"] = n.evaluate(call.split)
        finally:
            scratch.unlink(missing_ok=True)
        metrics = result["metrics"] if call.split == "val" else None  # the header's split
    if saved is not None:
        place(saved, "save").write_new(
            "save=", lambda path: write_averaged(averaged, path, metrics)
        )
    return result


def _resumed(call: TrainCall, entries: list[Any]) -> str | None:
    """The record a train job resumes (its config is the run's), or None for a new run."""
    if call.resume in ("false", ":false", False) or call.weights is not None:
        return None
    if call.resume in ("auto", ":auto"):
        return "latest => latest" if entries else None
    return str(call.resume)


def _run(
    spec: JobSpec, directory: Path, stop: _Stop, rank0: bool = False, report: bool = True
) -> tuple[dict[str, Any], str] | None:
    """The job's work; returns (result, end state), or None when the ranks of a
    several-process job recorded its end. ``report=False``: another rank than 0 of such a
    job, which trains and writes nothing to the job's files."""
    call = spec.call
    if isinstance(call, TrainCall):
        if (call.nproc > 1 or call.nodes > 1) and not rank0 and report:
            stop.check()
            rank_launch.launch(spec, directory)
            return None
        stop.check()
        return _train(spec, call, directory, stop, report)
    # _experiment named each field that differs from the record
    warnings.filterwarnings("ignore", r"weights from .* were trained under another config")
    stop.check()
    if isinstance(call, AverageCall):
        return _average(spec, call, directory, stop), "succeeded"
    return _validate(spec, call, directory, stop), "succeeded"


def _validate(spec: JobSpec, call: ValidateCall, directory: Path, stop: _Stop) -> dict[str, Any]:
    """A validate job: the record's experiment evaluated on the call's split."""
    from nitro_core import Nitro  # lazy: torch

    exp = _experiment(spec, call.weights)
    stop.check()
    update_status(directory, phase="loading")
    n = Nitro(exp, **call.nitro_kwargs())
    stop.check()
    update_status(directory, phase="validating")
    return {
        "metrics": n.evaluate(call.split),
        "split": call.split,
        "checkpoint": str(n.checkpoint_source),  # on object storage the record's URL
        "averaged_from": n.averaged_from,
    }


def _train(
    spec: JobSpec, call: TrainCall, directory: Path, stop: _Stop, report: bool
) -> tuple[dict[str, Any], str]:
    """A train job (or one rank of it): setup, then training to its end."""
    from nitro_core import Nitro  # lazy: torch

    status = update_status if report else _unreported
    record = _resumed(call, read_manifest(spec.run_dir))
    exp = _experiment(spec, record)  # a resume: the run's recorded config
    stop.check()
    status(directory, phase="setup")
    n = Nitro(exp, **call.nitro_kwargs())
    if record is not None and n.epoch >= exp.max_epochs:
        # queued behind another job, the run reached max_epochs meanwhile
        raise nothing_to_train(
            spec_arguments(spec, _root(directory)), n.run_id, n.epoch, exp.max_epochs
        )
    stop.check()  # before training: the run is left as it was
    stop.handle_ref = n
    status(
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
        status(
            directory,
            epoch=row["epoch"],
            step=row["step"],
            last_loss=row["train_loss"],
            last_val=row["val"],
        )
        if report:
            append_event(directory, {"time": now_iso(), "event": "epoch", **row})

    n.train(on_epoch=on_epoch, on_progress=_progress_writer(directory) if report else None)
    n.close()  # and the process group, when the handle made it
    listed = n.store.entries()
    kept = [e.model_dump() for e in listed if e.run == n.run_id]
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
    return result, "stopped" if n.stop_reason in ("requested", "budget") else "succeeded"


def _unreported(directory: Path, **changes: Any) -> None:
    """What another rank than 0 writes to the job's status: nothing."""


def _progress_writer(directory: Path) -> Callable[[Snapshot], None]:
    """The handle's progress listener: each snapshot (about every two seconds, never per
    step) lands in ``status.json`` by compare-and-set. Progress is best effort: a write that
    fails is logged, and training goes on."""

    def write(snap: Snapshot) -> None:
        changes: dict[str, Any] = {"progress": EpochProgress(
            epoch=snap.epoch, batch=snap.batch, batches=snap.batches, loss=snap.loss,
            epoch_eta_s=snap.epoch_eta_s, eta_s=snap.eta_s, at=snap.at,
        )}  # fmt: skip
        if snap.step is not None:
            changes["step"] = snap.step
        try:
            update_status(directory, **changes)
        except Exception:  # a full disk or a planted link: the next epoch's write says more
            log.exception("could not record the progress of epoch %d", snap.epoch)

    return write


def _warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    """At most 20 distinct warnings of at most 500 characters each."""
    texts = list(dict.fromkeys(str(w.message) for w in caught))[:20]
    return [t if len(t) <= 500 else t[:497] + "..." for t in texts]


def _failure(exc: Exception) -> Failure:
    """What kind of failure ``exc`` is (the MCP layer writes the call to send after it)."""
    if isinstance(exc, MonitorError | NonFiniteLoss):
        return "diverged"
    if isinstance(exc, CheckpointCorrupt):
        return "corrupt"
    return "refused" if isinstance(exc, NitroError) else "unexpected"


def _recorded_run(spec: JobSpec, directory: Path) -> str | None:
    """The job's run, when it wrote a record (a failed training can continue from it)."""
    run = _state_field(directory, "run_id")
    return run if run is not None and any(e.run == run for e in _entries(spec)) else None


def _root(directory: Path) -> Path:
    return directory.parent.parent.parent  # <root>/.nitro/jobs/<job_id>


def _state_field(directory: Path, name: str) -> Any:
    try:
        return getattr(read_status(directory), name)
    except (OSError, ValueError):
        return None


def _entries(spec: JobSpec) -> list[Any]:
    try:
        return read_manifest(spec.run_dir)
    except (OSError, NitroError):
        return []


if __name__ == "__main__":
    raise SystemExit(main())
