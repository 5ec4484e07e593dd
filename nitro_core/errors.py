"""Every error and warning Nitro raises, in one hierarchy.

Each class also subclasses the builtin a caller would naturally catch, so
``except ValueError`` keeps working for code that does not know Nitro::

    NitroError(Exception)
    ├── ConfigError(NitroError, ValueError)          bad experiment, keyword or checkpointer
    │   ├── MissingHookError(ConfigError)            a required hook is not defined
    │   └── SourceSyntaxError(ConfigError)           a source string does not parse
    ├── ResumeRefused(NitroError, ValueError)        a resume would not be exact (with a diff)
    ├── MonitorError(NitroError, ValueError)         the monitored metric is missing or not finite
    ├── CheckpointNotFound(NitroError, LookupError)  no entry matches what was asked for
    ├── CheckpointCorrupt(NitroError, OSError)       a record's bytes are not what was written
    │   └── CheckpointMissing(CheckpointCorrupt, FileNotFoundError)  a record is not on disk
    ├── DiskFull(NitroError, OSError)                no room left to write a record or a manifest
    ├── ObjectStoreError(NitroError, OSError)        the object store failed a call (S3)
    ├── UnsafePath(NitroError, PermissionError)      a path in a run directory is a link leading out
    ├── NotWritable(NitroError, PermissionError)     a directory Nitro writes in refuses the write
    ├── RecordError(NitroError, ValueError)          a state cannot be written as a record
    ├── TrainingRefused(NitroError, RuntimeError)    the handle cannot train from its state
    └── NonFiniteLoss(NitroError, FloatingPointError) the training loss became NaN or infinite

    NitroWarning(UserWarning)
    └── NitroDeprecationWarning(NitroWarning, FutureWarning)

A message has three parts: what failed, the offending value, and what to write instead.
An error keeps them as data, its ``parts``: prose (``str``), a keyword value (:class:`Arg`),
the failed call again with other arguments (:class:`Redo`), a call of one of Nitro's
operations (:class:`Call`), a change to the experiment's ``checkpointer()``
(:class:`CheckpointerFix`) or to its fields (:class:`FieldFix`), the call that lists a run
directory's records (:class:`Lister`), and a passage each audience reads in its own words
(:class:`Worded`). Each audience renders them once: ``str(exc)`` is
the :class:`PythonRenderer`'s text (``restore_optimizer=True``, ``Nitro(exp, weights=...)``);
the MCP layer renders the same parts as a tool call (``restore_optimizer=true``,
``nitro_train(..., weights=...)``). :func:`parts_to_json` and :func:`parts_from_json` carry
them through a job's status file. Messages are part of the contract: tests assert them.
"""

from __future__ import annotations

import difflib
import errno
import functools
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

from pydantic import TypeAdapter

Operation = Literal["train", "validate", "average"]


@dataclass(frozen=True)
class Arg:
    """A keyword and its value (a JSON value): ``restore_optimizer=True`` in Python,
    ``restore_optimizer=true`` in a tool call."""

    name: str
    value: Any
    kind: Literal["arg"] = "arg"


def arg(name: str, value: Any) -> Arg:
    """``name=value``, written for each audience."""
    return Arg(name, value)


@dataclass(frozen=True)
class Redo:
    """The call that failed, again with these arguments (a ``str`` is written as it stands,
    such as ``weights=...``): ``Nitro(exp, weights=...)`` in Python, ``nitro_train(...,
    weights=...)`` for the tool that failed."""

    args: tuple[Arg | str, ...]
    kind: Literal["redo"] = "redo"


@dataclass(frozen=True)
class Call:
    """A complete call of one of Nitro's operations with its arguments: the call model in
    Python (``TrainCall(experiment='Regression', ...)``), its tool for an MCP client."""

    operation: Operation
    args: dict[str, Any]
    kind: Literal["call"] = "call"


@dataclass(frozen=True)
class CheckpointerFix:
    """A ``Checkpointer(...)`` to write, ``arguments`` as module code (``keep=Last(1)``): no
    argument of a call can change it, only the experiment's ``checkpointer()``."""

    arguments: str
    kind: Literal["checkpointer"] = "checkpointer"

    # where it is written, said to a caller who can send no argument that changes it
    OUTSIDE_A_CALL: ClassVar[str] = (
        " returned by the experiment's checkpointer() (a change to its module)"
    )


@dataclass(frozen=True)
class FieldFix:
    """The experiment's config to change: ``field`` of ``type`` (a value that does not fit),
    or ``unknown``, a name among none of ``fields``."""

    experiment: str
    fields: tuple[str, ...]
    field: str | None = None
    type: str | None = None
    unknown: str | None = None
    kind: Literal["field"] = "field"

    def nearest(self) -> str | None:
        """The field nearest the unknown name (else the first field): what a fix offers."""
        if self.unknown is None:
            return None
        near = difflib.get_close_matches(self.unknown, self.fields, n=1) or list(self.fields[:1])
        return near[0] if near else None


@dataclass(frozen=True)
class Worded:
    """A passage each audience reads in its own words (where the fix is not one call); at a
    terminal, ``terminal`` (else the tool's words)."""

    python: str
    tool: str
    kind: Literal["worded"] = "worded"
    terminal: str | None = None


@dataclass(frozen=True)
class Lister:
    """What lists the records ``run_dir`` holds: ``read_manifest`` in Python,
    ``nitro_manifest`` for a tool call, ``nitro manifest RUN_DIR`` at a terminal."""

    run_dir: str | None = None
    kind: Literal["lister"] = "lister"


Part = str | Arg | Redo | Call | CheckpointerFix | FieldFix | Lister | Worded

WEIGHTS_ONLY = Redo(("weights=...",))  # a new run that takes only a checkpoint's weights

CALL_MODELS: dict[Operation, str] = {
    "train": "TrainCall",
    "validate": "ValidateCall",
    "average": "AverageCall",
}


class Renderer(Protocol):
    """Writes each part of an error for one audience."""

    def render(self, part: Part) -> str: ...


def render(parts: tuple[Part, ...], renderer: Renderer) -> str:
    """An error's parts written by ``renderer``, joined."""
    return "".join(renderer.render(p) for p in parts)


@dataclass(frozen=True)
class PythonRenderer:
    """Parts as a Python caller writes them: ``str(exc)``."""

    def render(self, part: Part) -> str:
        if isinstance(part, str):
            return part
        if isinstance(part, Arg):
            return f"{part.name}={part.value!r}"
        if isinstance(part, Redo):
            args = ", ".join(self.render(a) for a in part.args)
            return f"Nitro(exp, {args})"
        if isinstance(part, Call):
            args = ", ".join(f"{k}={v!r}" for k, v in part.args.items())
            return f"{CALL_MODELS[part.operation]}({args})"
        if isinstance(part, CheckpointerFix):
            return f"Checkpointer({part.arguments})"
        if isinstance(part, FieldFix):
            return f"Write {part.experiment}(field=value) with values that fit."
        if isinstance(part, Lister):
            return "read_manifest"
        return part.python


@functools.cache
def _parts_adapter() -> TypeAdapter[list[Part]]:
    return TypeAdapter(list[Part])


def parts_to_json(parts: tuple[Part, ...]) -> list[Any]:
    """An error's parts as JSON data (strings, and objects tagged by ``kind``)."""
    return _parts_adapter().dump_python(list(parts), mode="json")


def parts_from_json(data: Any) -> tuple[Part, ...]:
    """The parts :func:`parts_to_json` wrote."""
    return tuple(_parts_adapter().validate_python(data))


class NitroError(Exception):
    """Base of every error Nitro raises on purpose: ``NitroError(*parts)``, its text the
    parts as Python writes them (a plain message is one part)."""

    parts: tuple[Part, ...]

    def __init__(self, *parts: Part) -> None:
        self.parts = parts
        super().__init__(render(parts, PythonRenderer()))


class ConfigError(NitroError, ValueError):
    """An experiment, a keyword of ``Nitro`` or a checkpointer is not usable."""


class MissingHookError(ConfigError):
    """An experiment does not define a hook that training needs."""


class SourceSyntaxError(ConfigError):
    """A source string does not follow the grammar."""


class ResumeRefused(NitroError, ValueError):
    """Resuming would not continue the recorded run exactly; the message holds the diff."""


class MonitorError(NitroError, ValueError):
    """The monitored metric is not among the finalized metrics, or is not finite."""


class CheckpointNotFound(NitroError, LookupError):
    """No manifest entry or file matches the requested checkpoint."""


class CheckpointCorrupt(NitroError, OSError):
    """A record is truncated, altered, or not a Nitro record."""


class CheckpointMissing(CheckpointCorrupt, FileNotFoundError):
    """A record file (often one the manifest lists) is not on disk."""


class DiskFull(NitroError, OSError):
    """The disk has no room for a write; nothing half-written was kept (``errno`` ENOSPC)."""

    def __init__(self, *parts: Part) -> None:
        super().__init__(*parts)
        self.errno = errno.ENOSPC  # code that checks errno keeps working


class ObjectStoreError(NitroError, OSError):
    """The object store answered a call with an error other than a missing bucket or
    credentials (those are :class:`ConfigError`), or a manifest stayed contended."""


class UnsafePath(NitroError, PermissionError):
    """A file or directory Nitro keeps in a run directory is a symbolic link (or leads out of
    the directory), so opening it could read or write elsewhere."""


class NotWritable(NitroError, PermissionError):
    """A directory Nitro writes in (a run directory, its job store) refuses to be written:
    its permissions, or a read-only file system."""


class RecordError(NitroError, ValueError):
    """A training state holds something a record cannot store (a device leaf, an object)."""


class TrainingRefused(NitroError, RuntimeError):
    """The handle's state is not one training can continue from."""


class NonFiniteLoss(NitroError, FloatingPointError):
    """The training loss became NaN or infinite; the run stopped before writing anything."""


class NitroWarning(UserWarning):
    """Something worked, but not the way the user may think."""


class NitroDeprecationWarning(NitroWarning, FutureWarning):
    """A deprecated name still works and says what replaces it."""
