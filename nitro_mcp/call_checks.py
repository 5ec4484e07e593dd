"""The record's config as the default of the gate's calls, and the refusals of calls that
would silently do nothing or run twice.

- ``nitro_validate`` and ``average(validate=true)`` build the experiment from the config the
  record holds, with the call's ``overrides`` on top; each field that then differs from the
  record is named in a warning of the reply (:func:`from_record`).
- A resume takes the recorded config and lets ``overrides`` change Host fields only; a
  plain-field change is refused with the calls to send instead (:func:`resume_experiment`).
- A resume with nothing left to train is refused (:func:`check_something_to_train`), and so is
  a second train job on a run directory a queued or running one trains (:func:`refuse_busy`).
- ``logger='wandb'`` where the server's environment gives W&B no credentials and does not
  make it log offline is refused (:func:`check_tracker_credentials`): its job would fail at
  its first row.

Every refusal writes what to send as this tool's arguments (:mod:`nitro_core.jobs.calls`).
"""

from __future__ import annotations

import configparser
import netrc
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from nitro_core.errors import ConfigError, NitroError, ResumeRefused
from nitro_core.experiment import Experiment, config_of, host_fields
from nitro_core.jobs import JobManager, JobStatus
from nitro_core.jobs.calls import nothing_to_train, train_arguments
from nitro_core.sources.grammar import Source
from nitro_core.store.place import place
from nitro_mcp.record_fit import Shapes, record_shapes, registered_name
from nitro_mcp.refusals import for_tool
from nitro_mcp.tool_calls import tool_call, value

if TYPE_CHECKING:
    from nitro_core.store.run import RunStore
    from nitro_core.training.resume import ResumePoint

E = TypeVar("E", bound=Experiment)
WARNINGS_MAX = 8  # warnings in one reply, each at most WARNING_CHARS characters
WARNING_CHARS = 400
WANDB_HOST = "https://api.wandb.ai"  # W&B's own default for WANDB_BASE_URL
_WANDB_UNSENT = ("offline", "disabled", "dryrun")  # WANDB_MODE values that need no login
_SETTINGS_MAX = 1024 * 1024  # bytes of a netrc or W&B settings file read


def from_record(
    cls: type[E],
    source: Source,
    run_dir: Path | str | RunStore,
    overrides: Mapping[str, Any] | None,
) -> tuple[E, list[str], Path | str]:
    """``cls`` built from the config of the record ``source`` names (an ``Average``: its
    state record), with ``overrides`` on top; the warnings naming each difference; and the
    record's path (on object storage its URL: only its header was read)."""
    from nitro_core.training import from_record as fr  # lazy: record reads import torch

    try:
        recorded = fr.record_config(source, run_dir)
    except NitroError:  # no such record: an override the class refuses anyway is said first
        _check_alone(cls, overrides or {})
        raise
    exp, notes = fr.build_from_config(cls, recorded, overrides or {})
    return exp, notes, recorded.path


def _check_alone(cls: type[Experiment], overrides: Mapping[str, Any]) -> None:
    """Raise the class's own refusal of ``overrides`` over its defaults, if it has one."""
    try:
        cls()
    except ConfigError:  # a field without a default: nothing to check the overrides against
        return
    cls(**overrides)


def resume_experiment(
    cls: type[E],
    point: ResumePoint,
    overrides: Mapping[str, Any] | None,
    args: dict[str, Any],
    check_epochs: bool = True,
    registry: Mapping[str, type[Experiment]] | None = None,
    shapes: Shapes = lambda exp: None,
) -> E:
    """The experiment a resume continues: the recorded config, ``overrides`` changing Host
    fields only. ``args`` are the call's ``nitro_train`` arguments, for the refusals; a run
    another experiment wrote is refused first (naming it, from ``registry``), then, with
    ``check_epochs``, a resume with nothing left to train."""
    from nitro_core.training import from_record as fr  # lazy: record reads import torch

    written = point.meta.get("experiment")
    if isinstance(written, str) and written.rsplit(".", 1)[-1] != cls.__name__:
        run = point.meta.get("run", "?")
        registered = registered_name(written, registry or {})
        fix = (
            f"send experiment={registered!r}: "
            f"{tool_call('nitro_train', {**args, 'experiment': registered})}"
            if registered is not None
            else f"{written} is not registered here (nitro_experiments lists the experiments)"
        )
        raise ResumeRefused(
            f"resume={args['resume']!r} continues run {run} in run_dir={args['run_dir']!r}, which "
            f"{written} wrote, not {cls.__name__}; a resume continues a run under the experiment "
            f"that wrote it: {fix}."
        )
    recorded = point.meta.get("config") or {}
    exp, _ = fr.build_from_config(
        cls,
        fr.RecordConfig(point.path, point.meta.get("experiment"), dict(recorded)),
        overrides or {},
    )
    if check_epochs:
        check_something_to_train(point, exp, args)
    host = host_fields(cls)
    built = config_of(exp)
    plain = {
        k: v for k, v in (overrides or {}).items()
        if k not in host and built[k] != (recorded[k] if k in recorded else fr.declared_default(cls, k))
    }  # fmt: skip
    dropped = sorted(set(recorded) - set(cls.model_fields))
    if not plain and not dropped:
        return exp
    run = point.meta.get("run", "?")
    resume = args["resume"]
    what = f"run {run}" if point.continue_run else f"epoch {point.meta.get('epoch')} of run {run}"
    weights = f"{run} => latest" if resume in ("auto", ":auto") else resume
    rest = {k: v for k, v in args.items() if k not in ("experiment", "run_dir", "resume")}
    branch = tool_call(
        "nitro_train",
        {"experiment": args["experiment"], "run_dir": args["run_dir"], "weights": weights, **rest},
    )
    if dropped:
        held = ", ".join(f"{k}={recorded[k]!r}" for k in dropped)
        raise ResumeRefused(
            f"resume={resume!r} cannot continue {what} exactly: its recorded config holds "
            f"{held}, which {cls.__name__} no longer has. Start a new run from its weights: "
            f"{branch}."
        )
    changes = "; ".join(
        f"{k}: {recorded[k]!r} (record) -> {built[k]!r} (call)"
        if k in recorded
        else f"{k}: not in the record -> {built[k]!r} (call)"
        for k in plain
    )
    kept = {k: v for k, v in (overrides or {}).items() if k not in plain}
    again = tool_call("nitro_train", train_arguments(**{**args, "overrides": kept}))
    shown_file = f"{args['run_dir']}/{point.path.name}"
    misfit = branch_misfit(
        cls, overrides or {}, point, shown_file, bool(args.get("strict", True)), shapes
    )
    other = (
        f"or start a new run from its weights: {branch}"
        if misfit is None
        else f"a new run from its weights would not load them under these overrides: {misfit}"
    )
    raise ResumeRefused(
        f"resume={resume!r} continues {what} under its recorded config; overrides may change "
        f"only Host fields ({', '.join(sorted(host)) or 'none'}), and these change plain "
        f"fields: {changes}. Drop overrides={value(plain)} to resume: {again}, {other}."
    )


def branch_misfit(
    cls: type[Experiment],
    overrides: Mapping[str, Any],
    point: ResumePoint,
    origin: str,
    strict: bool,
    shapes: Shapes,
) -> str | None:
    """Why ``point``'s record would not load as weights= into the new run the branch call
    starts (``cls`` with the call's ``overrides``); None when it fits, or that cannot be told."""
    from nitro_core.state.loading import check_fits  # lazy: it imports torch

    try:
        exp = cls(**overrides)
    except (NitroError, ValueError):  # the branch call is refused for that itself
        return None
    record = record_shapes(point.meta)
    model = shapes(exp) if record is not None else None
    if record is None or model is None:
        return None
    try:
        check_fits(model, record, strict, origin, type(exp).__name__)
    except ConfigError as exc:
        return for_tool(exc, "nitro_train").rstrip(".")  # a branch is a nitro_train call
    return None


def check_something_to_train(point: ResumePoint, exp: Experiment, args: dict[str, Any]) -> None:
    """Refuse a resume whose record already reached the max_epochs the job would run to."""
    epoch = int(point.meta.get("epoch", 0))
    if epoch >= exp.max_epochs:
        raise nothing_to_train(args, str(point.meta.get("run", "?")), epoch, exp.max_epochs)


def busy_job(jobs: JobManager, where: Path | str) -> JobStatus | None:
    """The newest queued or running train job of ``where`` (a path, or an object-store
    run directory's URL), if any."""
    for status in jobs.live():  # the queued and running jobs, newest first
        if (
            status.kind == "train"
            and status.state in ("queued", "running")
            and _same_place(status.run_dir, where)
        ):
            return status
    return None


def _same_place(a: str, b: Path | str) -> bool:
    return place(a, "run_dir").same(place(b, "run_dir"))  # URLs as parsed, paths resolved


def refuse_busy(job: JobStatus, args: dict[str, Any]) -> ConfigError:
    """The refusal of a second train job on a run directory ``job`` trains."""
    at = f", epoch {job.epoch} of {job.max_epochs}" if job.max_epochs else ""
    queued = tool_call("nitro_train", train_arguments(**{**args, "after_running": True}))
    return ConfigError(
        f"run_dir={args['run_dir']!r} is already being trained by job {job.job_id} "
        f"({job.state}{at}); a second job there would train beside it. Follow that job with "
        f"nitro_status(job_id='{job.job_id}', wait_s=25), stop it with "
        f"nitro_stop(job_id='{job.job_id}'), or start this one when it ends: {queued}."
    )


def average_experiment(
    experiment: str | None,
    source: Source,
    where: Path | str,
    registry: Mapping[str, Any],
    run_dir: str,
) -> str:
    """The experiment an average is validated in: the one named, else the one its state
    record was written by, when that is registered."""
    from nitro_core.training.from_record import record_config  # lazy: record reads import torch

    if experiment is not None:
        return experiment
    written = record_config(source, where).experiment
    name = written.rsplit(".", 1)[-1] if written else None
    if name is not None and name in registry:
        return name
    example = tool_call(
        "average",
        {"run_dir": run_dir, "source": str(source), "validate": True, "experiment": "<name>"},
    )
    raise ConfigError(
        f"validate=true needs experiment=, the registered experiment the average is loaded "
        f"into; its record names {written!r}, which is not registered. nitro_experiments lists "
        f"them: {example}."
    )


def refuse_unused(
    run_dir: str, source: str, overrides: Mapping[str, Any] | None, split: str
) -> None:
    """Refuse ``overrides`` or ``split`` on an average that is not validated (they would do
    nothing)."""
    given = {k: v for k, v in (("overrides", overrides), ("split", split)) if v and v != "val"}
    if given:
        call = tool_call(
            "average", {"run_dir": run_dir, "source": source, "validate": True, **given}
        )
        shown = ", ".join(f"{k}={value(v)}" for k, v in given.items())
        raise ConfigError(
            f"{shown} apply only to the validation of the average; add validate=true: {call}, "
            f"or drop {' and '.join(given)}."
        )


def check_tracker_credentials(
    logger: str | None, args: dict[str, Any], root: Path, environ: Mapping[str, str] = os.environ
) -> None:
    """Refuse ``logger='wandb'`` (``args``: the call's ``nitro_train`` arguments) where the
    server's environment, which its jobs inherit (``environ``; their working directory
    ``root``), neither makes W&B log offline or not at all (``WANDB_MODE``, or ``mode`` in
    W&B's settings files) nor gives it credentials as W&B reads them: ``WANDB_API_KEY``,
    ``WANDB_IDENTITY_TOKEN_FILE``, an ``api_key`` setting, or the netrc file's entry for
    the host of ``WANDB_BASE_URL`` (or the ``base_url`` setting). A settings file that does
    not parse leaves the question to the job's own setup."""
    if logger != "wandb":
        return
    settings = _wandb_settings(environ, root)
    if settings is None:
        return
    mode = environ.get("WANDB_MODE") or settings.get("mode")
    if mode in _WANDB_UNSENT:
        return
    if any(environ.get(k) for k in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE")):
        return
    if settings.get("api_key"):
        return
    base = environ.get("WANDB_BASE_URL") or settings.get("base_url") or WANDB_HOST
    host = urlsplit(base).netloc
    netrc_file = Path(environ.get("NETRC") or Path(environ.get("HOME") or "~") / ".netrc")
    netrc_file = netrc_file.expanduser()
    if _netrc_login(netrc_file, host):
        return
    jsonl = tool_call("nitro_train", train_arguments(**{**args, "logger": "jsonl"}))
    said = f"mode {mode!r}" if mode else "no WANDB_MODE"
    raise ConfigError(
        f"logger='wandb' needs W&B credentials where the server runs, and it has none: no "
        f"WANDB_API_KEY, no entry for {host} in {str(netrc_file)!r}, and {said} (offline or "
        "disabled would need none). Set WANDB_API_KEY (or run wandb login) there, or "
        f"WANDB_MODE=offline to keep the W&B run in files, and restart the server; or send "
        f"logger='jsonl': {jsonl}."
    )


def _wandb_settings(environ: Mapping[str, str], root: Path) -> dict[str, str] | None:
    """The ``[default]`` keys of W&B's settings files, the global one (in
    ``WANDB_CONFIG_DIR``, else ``~/.config/wandb``) then the workspace's (``wandb/settings``
    in ``WANDB_DIR``, else the jobs' working directory), which wins; None when one is over
    its bound or does not parse."""
    home = Path(environ.get("HOME") or "~").expanduser()
    files = (
        Path(environ.get("WANDB_CONFIG_DIR") or home / ".config" / "wandb") / "settings",
        Path(environ.get("WANDB_DIR") or root) / "wandb" / "settings",
    )
    found: dict[str, str] = {}
    for path in files:
        parser = configparser.ConfigParser(interpolation=None)
        try:
            if os.stat(path).st_size > _SETTINGS_MAX:
                return None
            parser.read_string(path.read_text(), str(path))
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError, configparser.Error):
            return None
        if parser.has_section("default"):
            found.update(parser["default"])
    return found


def _netrc_login(path: Path, host: str) -> bool:
    """Whether the netrc file ``path`` has an entry with a password (W&B's API key) for
    ``host``; a file that is missing, over its bound or does not parse has none, as W&B
    reads it."""
    try:
        if not host or os.stat(path).st_size > _SETTINGS_MAX:
            return False
        found = netrc.netrc(str(path)).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return found is not None and bool(found[2])


def warnings_of(notes: list[str], result: Mapping[str, Any]) -> list[str]:
    """The call's config warnings, then the job's own, without repeats (bounded)."""
    texts = list(dict.fromkeys([*notes, *(result.get("warnings") or [])]))[:WARNINGS_MAX]
    return [t if len(t) <= WARNING_CHARS else t[: WARNING_CHARS - 3] + "..." for t in texts]
