"""Observability over MCP: a run's metric history as compact columns (``nitro_history``), its
curves as a PNG (``nitro_plot``), and the checks on ``nitro_train(logger=...)``.

Both tools read the JSONL metrics log ``<run_dir>/logs/<run>.jsonl`` (one row per epoch:
epoch, step, train_loss, lr, val{...}, seconds; per-step rows too where a logger writes
them), which every built-in logger keeps, TensorBoardLogger included. Logs are opened
without following a link (``O_NOFOLLOW``), and at most the last ``READ_MAX`` bytes of one
are read. A reply stays bounded whatever the log holds: history fits its rows in
``ROWS_CHARS`` characters, newest kept, and says how to see the rest; a plot is a small PNG.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nitro_core.errors import ConfigError, Part, ResumeRefused, UnsafePath, Worded
from nitro_core.jobs.call_models import LOGGER_REFUSAL
from nitro_core.jobs.calls import train_arguments
from nitro_core.store import metrics_log
from nitro_core.store.metrics_log import READ_MAX
from nitro_core.training.loggers import LOGGER_CALLS, LOGGERS, installed
from nitro_mcp import models
from nitro_mcp.echo import clip, clip_text
from nitro_mcp.paths import shown
from nitro_mcp.tool_calls import tool_call

ROWS_CHARS = 6000  # the rows of a history reply, as compact JSON
REPLY_CHARS = 7500  # the whole history reply, with room to spare under 8,000
COLUMNS_CHARS = 1500  # the column names of a history reply
RUNS_SHOWN = 20
PLOT_RUNS = 8
PLOT_METRICS = 6
_RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_EXAMPLE = {"columns": "['epoch', 'val.loss']", "metrics": "['train_loss', 'val.loss']"}
INSTALL_PLOT = "pip install 'nitro[plot]' (or pip install 'matplotlib>=3.7')"

Cell = float | int | str | None

if TYPE_CHECKING:
    from nitro_core.training.resume import ResumePoint


# -- reading logs ----------------------------------------------------------------------------
class RunLog:
    """The rows of one run's log, flattened: ``val: {"loss": x}`` becomes ``val.loss``."""

    def __init__(self, run: str, rows: list[dict[str, Cell]], skipped: int, cut: bool) -> None:
        self.run, self.rows, self.skipped, self.cut = run, rows, skipped, cut
        self.label = f"run {run}"  # how refusals name it
        self.columns = list(dict.fromkeys(k for row in rows for k in row))

    def epochs(self) -> str:
        found = [r["epoch"] for r in self.rows if isinstance(r.get("epoch"), int)]
        return f"epochs {found[0]}-{found[-1]}" if found else "no epochs"

    def column(self, name: str, arg: str) -> str:
        """``name`` as one of this log's columns (``acc`` is read as ``val.acc``), or the
        refusal naming the columns there are."""
        if name in self.columns:
            return name
        if f"val.{name}" in self.columns:
            return f"val.{name}"
        raise ConfigError(
            f"{arg}: {clip(name)} is not a column of {self.label}; it has "
            f"{clip_text(', '.join(self.columns), 600)}. Write e.g. {arg}={_EXAMPLE[arg]}."
        )


def log_runs(run_dir: Path) -> list[str]:
    """Run ids with a metrics log in ``run_dir``, least recently written first."""
    logs = run_dir / "logs"
    if not os.path.lexists(logs):
        return []
    if not logs.resolve().is_relative_to(run_dir.resolve()) or not logs.is_dir():
        raise UnsafePath(
            f"Refusing to read {str(logs)!r}: it is a link that leads outside the run directory "
            f"{str(run_dir)!r} (or not a directory), and Nitro reads logs only inside it. "
            "Replace the link by a real directory, or remove it."
        )
    found = []
    with os.scandir(logs) as it:
        for entry in it:
            if entry.name.endswith(".jsonl") and entry.is_file(follow_symlinks=False):
                found.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.name[:-6]))
    return [run for _, run in sorted(found)]


def pick_run(run_dir: Path, root: Path, run: str | None, arg: str = "run") -> str:
    """``run`` when its log exists, else (None) the run whose log was written last."""
    runs = log_runs(run_dir)
    where = shown(root, run_dir)
    if run is not None:
        if not isinstance(run, str) or not _RUN_ID.fullmatch(run):
            raise ConfigError(
                f"{arg}={clip(run)} is not a run id; ",
                Worded(
                    python=f"runs({where!r}) lists the runs, e.g. {arg}='a1b2c3d4'.",
                    tool=f"nitro_runs(run_dir={where!r}) lists the runs, e.g. {arg}='a1b2c3d4'.",
                    terminal=f"nitro runs {shlex.quote(where)} lists the runs, e.g. "
                    f"--{arg} a1b2c3d4.",
                ),
                " Leave it out for the latest run.",
            )
        if run not in runs:
            have = ", ".join(runs[-RUNS_SHOWN:]) or "none"
            raise ConfigError(
                f"{arg}={run!r} has no metrics log in run_dir={where!r} (logs/{run}.jsonl); "
                f"runs with a log: {have}. Write one of those, or leave {arg} out for the latest."
            )
        return run
    if not runs:
        raise ConfigError(
            f"run_dir={where!r} holds no metrics log (logs/<run>.jsonl): no run there has "
            "finished an epoch yet. ",
            Worded(
                python="JobManager(root).list() shows where jobs train.",
                tool="nitro_jobs shows where jobs train; follow one with "
                "nitro_status(job_id=..., wait_s=25, until='end', brief=true).",
                terminal="nitro jobs shows where jobs train; follow one with "
                "nitro status JOB_ID --wait 25 --until end --brief.",
            ),
        )
    return runs[-1]


def read_log(run_dir: Path, run: str) -> RunLog:
    """The rows of ``logs/<run>.jsonl``, flattened (the core's one reader,
    :func:`nitro_core.store.metrics_log.read_log`)."""
    log = metrics_log.read_log(run_dir, run)
    return RunLog(run, [_flat(row) for row in log.rows], log.skipped, log.cut)


def _flat(row: dict[str, Any], prefix: str = "") -> dict[str, Cell]:
    out: dict[str, Cell] = {}
    for key, value in row.items():
        if key == "run" and not prefix:
            continue
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = _cell(value)
    return out


def _cell(value: Any) -> Cell:
    """A number to 5 significant digits, a non-finite one as 'nan'/'inf'/'-inf'."""
    if isinstance(value, bool) or value is None:
        return None if value is None else int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return float(f"{value:.5g}")
    return clip(value, 40) if isinstance(value, str) else None


# -- nitro_history ---------------------------------------------------------------------------
def history(
    root: Path, run_dir: Path, run: str | None, columns: list[str] | None, every: int,
    last: int | None,
) -> models.HistoryResult:  # fmt: skip
    """The rows of a run's log as columns, thinned by ``every`` (ending at the last row),
    the last ``last`` of them, cut from the front to fit the reply."""
    _check_count("every", every, 1, 100_000, "every=2 keeps every second row, ending at the last")
    if last is not None:
        _check_count("last", last, 1, 100_000, "last=50 shows the last 50 rows")
    run = pick_run(run_dir, root, run)
    log = read_log(run_dir, run)
    names = _columns(log, columns)
    total = len(log.rows)
    kept = log.rows[::-1][::every][::-1]  # every ``every``-th row, the last one included
    if last is not None:
        kept = kept[-last:]
    table = [[row.get(c) for c in names] for row in kept]
    where = shown(root, run_dir)
    runs = log_runs(run_dir)[-RUNS_SHOWN:]
    rest = len(json.dumps([names, runs])) + 4 * len(where) + 900  # the reply's other fields
    shown_rows = _fit(table, min(ROWS_CHARS, REPLY_CHARS - rest))
    return models.HistoryResult(
        run_dir=where, run=run, runs=runs, total_rows=total, columns=names, rows=shown_rows,
        next=_history_next(where, log, names, columns, every, len(kept), len(shown_rows)),
    )  # fmt: skip


def _columns(log: RunLog, asked: list[str] | None) -> list[str]:
    if asked is None:
        names: list[str] = []
        for c in log.columns:  # bounded: a log with hundreds of metrics still fits
            if len(json.dumps(names + [c])) > COLUMNS_CHARS:
                break
            names.append(c)
        return names
    if not isinstance(asked, list) or not asked or len(asked) > 50:
        raise ConfigError(
            f"columns={clip(asked)} must be a list of 1 to 50 column names, e.g. "
            "columns=['epoch', 'val.loss']; leave it out for every column."
        )
    names = [log.column(str(c), "columns") for c in asked]
    if "epoch" in log.columns and "epoch" not in names:
        names.insert(0, "epoch")  # rows stay readable as epochs
    return list(dict.fromkeys(names))


def _fit(table: list[list[Cell]], budget: int) -> list[list[Cell]]:
    """The last rows of ``table`` whose compact JSON fits in ``budget`` characters."""
    used, start = 2, len(table)
    while start > 0:
        size = len(json.dumps(table[start - 1], separators=(",", ":"))) + 1
        if used + size > budget:
            break
        used += size
        start -= 1
    return table[start:]


def _history_next(
    where: str, log: RunLog, names: list[str], asked: list[str] | None, every: int, kept: int,
    shown_rows: int,
) -> str:  # fmt: skip
    call = f"nitro_history(run_dir={where!r}, run={log.run!r}"
    notes = []
    if log.cut:
        notes.append(f"The log is over {READ_MAX // 2**20} MiB; only its end was read.")
    if log.skipped:
        notes.append(f"{log.skipped} line(s) of the log are not JSON rows and were skipped.")
    if asked is None and len(names) < len(log.columns):
        notes.append(
            f"{len(log.columns) - len(names)} more column(s) ({clip_text(', '.join(log.columns[len(names) :]), 300)}): "
            f"name them with {call}, columns=[...])."
        )
    total = len(log.rows)
    if shown_rows < kept:
        step = max(every + 1, math.ceil(total / max(shown_rows, 1)))
        first = (
            f"the last {shown_rows} of {kept}"
            if every == 1
            else f"the last {shown_rows} of {kept} thinned"
        )
        notes.append(
            f"{total} rows ({log.epochs()}); these are {first}. The whole run thinned: "
            f"{call}, every={step}); fewer columns fit more rows, e.g. columns=['epoch', "
            f"'{_main_metric(names)}']."
        )
    elif kept < total:
        notes.append(
            f"{total} rows ({log.epochs()}); these are {kept} of them. Every row: {call}) "
            "with every=1 and no last, cut to what fits."
        )
    else:
        notes.append(
            f"All {total} rows ({log.epochs()}). nitro_plot(run_dir={where!r}) draws them."
        )
    return " ".join(notes)


def _main_metric(names: list[str]) -> str:
    return next((n for n in names if n.startswith("val.")), "train_loss")


# -- nitro_plot --------------------------------------------------------------------------------
def plot(
    root: Path, run_dir: Path, runs: list[str] | None, metrics: list[str] | None
) -> tuple[bytes, tuple[Part, ...]]:
    """A PNG of the metrics (one panel each, epoch on x, one line per run) and its caption (as
    an error's parts: each surface writes the call that shows the numbers in its own words)."""
    _matplotlib()
    where = shown(root, run_dir)
    if runs is not None and (not isinstance(runs, list) or not 1 <= len(runs) <= PLOT_RUNS):
        raise ConfigError(
            f"runs={clip(runs)} must be a list of 1 to {PLOT_RUNS} run ids, e.g. ",
            Worded(
                python=f"runs=['a1b2c3d4']; runs({where!r}) lists them.",
                tool=f"runs=['a1b2c3d4']; nitro_runs(run_dir={where!r}) lists them.",
                terminal=f"--runs a1b2c3d4; nitro runs {shlex.quote(where)} lists them.",
            ),
            " Leave it out for the latest run.",
        )
    wanted: list[str | None] = list(runs) if runs else [None]
    picked = [pick_run(run_dir, root, r, "runs") for r in wanted]
    logs = [read_log(run_dir, r) for r in dict.fromkeys(picked)]
    columns = list(dict.fromkeys(c for log in logs for c in log.columns))
    union = RunLog(", ".join(log.run for log in logs), [], 0, False)
    union.columns, union.label = columns, f"run{'s' if len(logs) > 1 else ''} {union.run}"
    if metrics is None:
        chosen = [c for c in columns if c == "train_loss" or c.startswith("val.")]
        chosen = chosen[:PLOT_METRICS] or [c for c in columns if c not in ("epoch", "step")][:1]
    elif not isinstance(metrics, list) or not 1 <= len(metrics) <= PLOT_METRICS:
        raise ConfigError(
            f"metrics={clip(metrics)} must be a list of 1 to {PLOT_METRICS} column names, e.g. ",
            Worded(
                python="metrics=['train_loss', 'val.loss']",
                tool="metrics=['train_loss', 'val.loss']",
                terminal="--metrics train_loss val.loss",
            ),
            "; leave it out for the loss and val metrics.",
        )
    else:
        chosen = list(dict.fromkeys(union.column(str(m), "metrics") for m in metrics))
    if not chosen:
        raise ConfigError(
            f"run_dir={where!r}: the logs of {union.label} hold no metric to plot; ",
            numbers_in(where, None),
            " shows what they hold.",
        )
    png = _draw(logs, chosen)
    drawn = "; ".join(f"run {log.run} ({log.epochs()})" for log in logs)
    caption = (
        f"{where}: {drawn}. Panels: {', '.join(chosen)}. The numbers: ",
        numbers_in(where, logs[-1].run),
        ".",
    )
    return png, caption


def numbers_in(where: str, run: str | None) -> Worded:
    """What shows a run's logged numbers: ``nitro_history(...)``, ``nitro history ...``."""
    tool = f"nitro_history(run_dir={where!r}{'' if run is None else f', run={run!r}'})"
    terminal = f"nitro history {shlex.quote(where)}{'' if run is None else f' --run {run}'}"
    return Worded(python=tool, tool=tool, terminal=terminal)


def _matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401  # lazy: an optional dependency
    except ImportError:
        raise ConfigError(
            Worded(
                python="plot needs matplotlib, which is not installed: "
                f"{INSTALL_PLOT}. history gives the same numbers as text.",
                tool="nitro_plot needs matplotlib, which is not installed where the server runs: "
                f"{INSTALL_PLOT}, then restart the server. nitro_history gives the same numbers "
                "as text.",
                terminal=f"nitro plot needs matplotlib, which is not installed: {INSTALL_PLOT}. "
                "nitro history gives the same numbers as text.",
            )
        ) from None


def _draw(logs: list[RunLog], metrics: list[str]) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: optional, heavy
    from matplotlib.figure import Figure  # lazy
    from matplotlib.ticker import MaxNLocator  # lazy

    cols = min(len(metrics), 3)
    rows = math.ceil(len(metrics) / cols)
    fig = Figure(figsize=(3.3 * cols, 2.4 * rows), dpi=80, layout="constrained")
    FigureCanvasAgg(fig)  # the Agg backend, without pyplot's global state
    for i, metric in enumerate(metrics):
        ax = fig.add_subplot(rows, cols, i + 1)
        for log in logs:
            points = [
                (r["epoch"], _number(r.get(metric)))
                for r in log.rows
                if isinstance(r.get("epoch"), int) and r.get(metric) is not None
            ]
            if points:
                ax.plot(*zip(*points), marker="." if len(points) < 30 else None, label=log.run)
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel("epoch", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if len(logs) > 1 and i == 0:
            ax.legend(fontsize=7)
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()


def _number(cell: Cell) -> float:
    return float(cell) if isinstance(cell, int | float | str) else math.nan


# -- nitro_train(logger=...) -------------------------------------------------------------------
def check_logger_name(logger: str | None) -> None:
    """``logger`` names a logger this server can write (its package installed here)."""
    if logger is not None and logger not in LOGGERS:
        raise ConfigError(LOGGER_REFUSAL.format(value=clip(logger)))
    if logger is not None and not installed(logger):
        raise ConfigError(
            f"logger={logger!r} needs the {logger} package where the server runs: "
            f"pip install 'nitro[{logger}]' there and restart the server, or send "
            "logger='jsonl'."
        )


def check_logger(
    logger: str | None,
    point: ResumePoint | None,
    exp: Any,
    args: dict[str, Any],
    hooked: str | None,
) -> None:
    """A resume keeps the logger backend its record was written with: refused otherwise,
    with the call to send instead (``args``: this call's arguments; ``hooked``: the backend
    the experiment's ``logger()`` returns, asked of a process of its own, None when it could
    not say: then a mismatch is left to the job's own check)."""
    if point is None:
        return
    recorded = point.meta.get("logger", {}).get("backend")
    if logger is None and hooked is None:
        return  # the job's setup compares it with the record (training.loggers)
    chosen = logger or hooked
    if recorded is None or recorded == chosen:
        return
    name, make = type(exp).__name__, LOGGER_CALLS.get(recorded, f"a {recorded!r} logger")
    if recorded == hooked:
        fix = f"Leave logger out, for {name}.logger() ({make}): send " + tool_call(
            "nitro_train", train_arguments(**{**args, "logger": None})
        )
    elif recorded in LOGGERS:
        fix = f"Set logger={recorded!r}: send " + tool_call(
            "nitro_train", train_arguments(**{**args, "logger": recorded})
        )
    else:
        fix = (
            f"Its backend is not one nitro_train can choose: return {make} from "
            f"{name}.logger() and send no logger, or start a new run_dir"
        )
    raise ResumeRefused(
        f"resume={args.get('resume', 'false')!r} continues {Path(point.file).name!r}, whose logger state "
        f"is for the {recorded!r} backend, but this call logs with {chosen!r}: a resume keeps "
        f"the run's logger so that its logs continue without gaps or repeats. {fix}."
    )


def _check_count(name: str, value: Any, low: int, high: int, example: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(
            f"{name}={clip(value)} is out of range; give {low} to {high} ({example})."
        )
