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
    ├── UnsafePath(NitroError, PermissionError)      a path in a run directory is a link leading out
    ├── RecordError(NitroError, ValueError)          a state cannot be written as a record
    ├── TrainingRefused(NitroError, RuntimeError)    the handle cannot train from its state
    └── NonFiniteLoss(NitroError, FloatingPointError) the training loss became NaN or infinite

    NitroWarning(UserWarning)
    └── NitroDeprecationWarning(NitroWarning, FutureWarning)

A message has three parts: what failed, the offending value, and what to write instead.
The MCP layer passes the text through unchanged, so messages are part of the contract.
"""

from __future__ import annotations

import errno


class NitroError(Exception):
    """Base of every error Nitro raises on purpose."""


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

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.errno = errno.ENOSPC  # code that checks errno keeps working


class UnsafePath(NitroError, PermissionError):
    """A file or directory Nitro keeps in a run directory is a symbolic link (or leads out of
    the directory), so opening it could read or write elsewhere."""


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
