"""WandbLogger: a run's rows as the history of a Weights & Biases run, which a resume
continues.

Where and how W&B logs comes from its own settings: ``project``, ``entity``, ``mode`` and
``dir`` when given, else ``WANDB_PROJECT`` (default ``"nitro"``), ``WANDB_ENTITY``,
``WANDB_MODE`` (``online``, ``offline``, ``disabled``) and ``WANDB_DIR``. The W&B run's id,
project, entity and directory are kept in every record, so a resume continues the same W&B
run (``resume="allow"``) and sends no step twice (:mod:`nitro_core.training.trackers`): the
last step it holds is the resumed run's starting step online, and is read from the run's
earlier offline files (``<dir>/wandb/offline-run-*-<id>/run-<id>.wandb``) offline.
Online, setup checks that W&B has credentials (``wandb login``, ``WANDB_API_KEY``) and that
its server (``WANDB_BASE_URL``) answers within ``NITRO_TRACKER_TIMEOUT_S``; a fresh run is
refused otherwise, naming what to do (``wandb login``, or ``WANDB_MODE=offline`` and
``wandb sync`` later), and a resume goes on without W&B (:mod:`nitro_core.training.trackers`).
``wandb`` is imported at setup to read its settings unless ``mode`` is ``offline``,
``dryrun`` or ``disabled``, never at import; it captures no console output (stdout may be an
MCP channel).
"""

from __future__ import annotations

import os
import struct
import time
import zlib
from pathlib import Path
from typing import Any

from nitro_core.training.tracker_calls import bounded, reason, unreachable
from nitro_core.training.trackers import TrackerLogger, Unanswered, require

DEFAULT_PROJECT = "nitro"
LOCAL_MODES = ("offline", "dryrun", "disabled")  # W&B's modes that ask no server
OFFLINE_FIX = (
    "log offline with WANDB_MODE=offline (or WandbLogger(mode='offline')) and upload later "
    "with `wandb sync`"
)
_BLOCK = 32768  # the .wandb file: LevelDB-style blocks of records, after a 7-byte header
_HEADER = 7


class WandbLogger(TrackerLogger):
    """One W&B run per Nitro run, its history at the row's optimizer ``step`` (``train_loss``,
    ``lr``, ``seconds``, ``epoch``, ``val/<metric>``), the JSONL log too. ``params`` become
    the run's config when it is created; its name is the Nitro run id. Needs
    ``pip install 'nitro[wandb]'``."""

    backend = "wandb"
    tracker = "W&B"

    def _load(self) -> None:
        import wandb  # noqa: F401

    def __init__(
        self,
        project: str | None = None,
        entity: str | None = None,
        mode: str | None = None,
        dir: str | os.PathLike[str] | None = None,
        params: dict[str, Any] | None = None,
    ) -> None:
        require("wandb", "WandbLogger", "wandb", "wandb>=0.17")  # refused at setup
        super().__init__(params)
        self.project, self.entity, self.mode = project, entity, mode
        self.dir = None if dir is None else str(dir)
        self._run: Any = None
        self._url: str | None = None  # the server asked, online (None: offline)

    def _check(self, ids: dict[str, Any] | None) -> Unanswered | None:
        if self.mode in LOCAL_MODES:
            return None
        import wandb  # lazy: its settings resolved (environment, settings files)

        settings = wandb.setup().settings
        if (self.mode or settings.mode) in LOCAL_MODES:
            return None
        self._url = url = str(settings.base_url)
        login = f"Run `wandb login` (or set WANDB_API_KEY), or {OFFLINE_FIX}"
        try:  # no network without credentials; with them, its "logged in" line may ask
            has_credentials = wandb.run is not None or bounded(
                lambda: wandb.login(prompt=False, verify=False), self._seconds
            )
        except TimeoutError as exc:
            return self._unreachable(reason(exc, self._seconds))
        except Exception as exc:  # credentials it does not take (a malformed key)
            refused = reason(exc, self._seconds)
            return Unanswered(
                f"logs online to {url}, but W&B refuses its credentials: {refused}", login
            )
        if not has_credentials:
            return Unanswered(
                f"logs online to {url}, but no W&B credentials are configured here", login
            )
        why = unreachable(url, self._seconds)
        return None if why is None else self._unreachable(why)

    def _unreachable(self, why: str) -> Unanswered:
        return Unanswered(
            f"cannot reach the W&B server at {self._url}: {why}",
            f"Point WANDB_BASE_URL at a server that answers, or {OFFLINE_FIX}",
        )

    def _where(self) -> str:
        return f"at {self._url}" if self._url else "(offline)"

    def _start(self, ids: dict[str, Any] | None) -> dict[str, Any]:
        import wandb  # lazy: a heavy import

        fresh = ids is None
        ids = ids or {
            "id": None,  # W&B picks it
            "project": self.project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT,
            "entity": self.entity or os.environ.get("WANDB_ENTITY"),
            "dir": self.dir or os.environ.get("WANDB_DIR"),
        }
        if not fresh:  # a new offline directory, never the stopped run's (named by second)
            _after_existing_runs(Path(ids["dir"] or ".") / "wandb", ids["id"])
        self._run = wandb.init(
            id=ids["id"],
            project=ids["project"],
            entity=ids["entity"],
            dir=ids["dir"],
            mode=self.mode,  # type: ignore[arg-type]  # None: WANDB_MODE, else online
            name=self.run_id,
            config=self.params if fresh else None,
            resume=None if fresh else "allow",
            reinit="create_new",  # one run per logger, however many in this process
            settings=wandb.Settings(console="off"),
        )
        return {**ids, "id": self._run.id}

    def _held_step(self) -> int:
        if self._run.offline:
            here = Path(self._run.dir).parent  # this process's offline-run directory
            return max(
                (
                    step
                    for f in _offline_files(here.parent, self._run.id, here)
                    for step in _steps(f)
                ),
                default=-1,
            )
        return int(self._run.step) - 1  # online: the resumed run starts past its last step

    def _send(self, values: list[tuple[str, float]], step: int) -> None:
        self._run.log(dict(values), step=step)

    def _finish(self) -> None:
        self._run.finish()
        self._run = None


def _after_existing_runs(wandb_dir: Path, run_id: str) -> None:
    """Wait (under two seconds) until an offline directory made now, named by the current
    whole second, is not one an earlier process of this run made (W&B would write over its
    transaction log)."""
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and any(
        (wandb_dir / f"offline-run-{stamp}-{run_id}").exists()
        for stamp in (time.strftime("%Y%m%d_%H%M%S"), time.strftime("%Y%m%d_%H%M%S", time.gmtime()))
    ):
        time.sleep(0.05)


def _offline_files(wandb_dir: Path, run_id: str, skip: Path) -> list[Path]:
    """The transaction logs of the earlier offline runs with this id (not ``skip``'s)."""
    return [
        d / f"run-{run_id}.wandb"
        for d in sorted(wandb_dir.glob(f"offline-run-*-{run_id}"))
        if d != skip and (d / f"run-{run_id}.wandb").is_file()
    ]


def _steps(path: Path) -> list[int]:
    """The history steps a ``.wandb`` transaction log holds, once it is settled: W&B's
    service writes it after ``finish()`` returns, so wait (at most 10 s) for its exit
    record, or for it to stay unchanged for a second (a killed run writes none)."""
    deadline, seen, since = time.monotonic() + 10, -1, time.monotonic()
    while True:
        raw = path.read_bytes()
        steps, exited = _history(raw)
        if exited or time.monotonic() > deadline:
            return steps
        if len(raw) != seen:
            seen, since = len(raw), time.monotonic()
        elif time.monotonic() - since > 1:
            return steps
        time.sleep(0.05)


def _history(raw: bytes) -> tuple[list[int], bool]:
    """(history steps, whether the exit record is there) of a transaction log's bytes
    (records parsed with W&B's own protobuf definitions)."""
    from wandb.proto import wandb_internal_pb2 as pb  # lazy

    steps, exited = [], False
    for data in _records(raw):
        record = pb.Record()  # type: ignore[attr-defined]  # generated, untyped
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            steps.append(int(record.history.step.num))
        exited = exited or kind == "exit"
    return steps, exited


def _records(raw: bytes) -> list[bytes]:
    """The records of a LevelDB-style log: 32 KiB blocks of chunks, each with a 7-byte
    header (CRC-32, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    out, part, at = [], b"", _HEADER  # the file's own header: ':W&B', magic, version
    while at + _HEADER <= len(raw):
        room = _BLOCK - at % _BLOCK
        if room < _HEADER:  # the block's tail is padding
            at += room
            continue
        crc, length, kind = struct.unpack("<IHB", raw[at : at + _HEADER])
        data = raw[at + _HEADER : at + _HEADER + length]
        if len(data) < length or zlib.crc32(data, zlib.crc32(bytes([kind]))) != crc:
            break  # a chunk cut by a kill, or none past here
        at += _HEADER + length
        part += data
        if kind in (1, 4):
            out.append(part)
            part = b""
    return out
