"""Setup helpers of the handle: where a run lives, which device, the data splits, the hook
return values, and Ctrl+C."""

from __future__ import annotations

import math
import re
import signal
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from nitro_core.errors import ConfigError, NitroWarning, ObjectStoreError
from nitro_core.experiment import Experiment
from nitro_core.policy.selectors import Checkpointer
from nitro_core.sources.resolve import partial_files
from nitro_core.store import recordio as store
from nitro_core.store.reclaim import described
from nitro_core.store.run import RunStore, open_run
from nitro_core.training import progress


def run_store(run_dir: str | Path | None, ckpt: Checkpointer | None, name: str) -> RunStore:
    """The run directory ``run_dir`` (or ``Checkpointer(dir=...)``, else ``runs/<name>``)
    names: a local directory or ``s3://bucket/prefix/run`` (a URL of another scheme is
    refused); both named and different is refused."""
    named = ckpt.dir if ckpt is not None and ckpt.dir is not None else None
    if named is not None and run_dir is not None and open_run(run_dir) != open_run(named):
        raise ConfigError(
            f"run_dir={str(run_dir)!r} disagrees with Checkpointer(dir={named!r}); give "
            "one of them, or the same directory to both."
        )
    return open_run(run_dir if run_dir is not None else named or Path("runs") / name)


_DEVICE = re.compile(r"auto|cpu|cuda(:(0|[1-9][0-9]{0,2}))?")


def resolve_device(device: str | torch.device) -> torch.device:
    """'auto', 'cpu', 'cuda' or 'cuda:N' (or such a ``torch.device``) that this machine has;
    anything else (``mps``, ``meta``, ``cpu:0``, a typo) is refused here, not by torch later."""
    if isinstance(device, torch.device):
        text = str(device)
    elif isinstance(device, str):
        text = device
    else:
        text = ""
    if not _DEVICE.fullmatch(text):
        raise ConfigError(
            f"device={_echo(device)} is not a device; write 'auto', 'cpu' or 'cuda:0'."
        )
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(text)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"device={device!r} asks for CUDA, which this machine lacks; write 'auto' or 'cpu'."
        )
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise ConfigError(
            f"device={device!r} names CUDA device {dev.index}, but this machine has {count} "
            f"(cuda:0 to cuda:{count - 1}); write 'auto' or 'cuda:0'."
        )
    return dev


def _echo(value: Any, limit: int = 80) -> str:
    """A value as a refusal echoes it: its repr, cut to about ``limit`` characters (an
    integer too long to write says how long it is)."""
    if isinstance(value, str):
        return repr(value if len(value) <= limit else value[:limit] + "…")
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 3 * limit:
        return f"(an integer of about {int(value.bit_length() * 0.30103) + 1} digits)"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def build_splits(exp: Experiment) -> dict[str, Any]:
    name = type(exp).__name__
    data = exp.build_data()
    if not isinstance(data, dict):
        raise ConfigError(
            f"{name}.build_data() returned {type(data).__name__}; return a dict of split name -> "
            "re-iterable of batches, e.g. {'train': ..., 'val': ...}."
        )
    if "train" not in data:
        raise ConfigError(
            f"{name}.build_data() returned the splits {sorted(data)} without 'train'; return "
            "{'train': ..., 'val': ...} ('train' is required to train, 'val' enables ranking)."
        )
    return data


def check_kind(name: str, hook: str, value: Any, kind: type) -> None:
    if value is not None and not isinstance(value, kind):
        raise ConfigError(
            f"{name}.{hook}() returned {value!r}; return {kind.__name__}(...) or None."
        )


def summary(row: dict[str, Any]) -> str:
    val = " ".join(
        f"{k}={v:.4g}" for k, v in row["val"].items() if isinstance(v, float) and math.isfinite(v)
    )
    return f"epoch {row['epoch']} step {row['step']} train_loss={row['train_loss']:.4g} {val}"


def install_sigint(stop: Any) -> Any:
    """Ctrl+C asks for a graceful stop and says so on stderr (``progress.STOPPING``); a
    second Ctrl+C interrupts at once."""
    if threading.current_thread() is not threading.main_thread():
        return None
    pressed: list[bool] = []

    def handler(signum: int, frame: Any) -> None:
        if pressed:
            raise KeyboardInterrupt
        pressed.append(True)
        stop()
        progress.notice(progress.STOPPING)

    return signal.signal(signal.SIGINT, handler)


def restore_sigint(previous: Any) -> None:
    if previous is not None:
        signal.signal(signal.SIGINT, previous)


def warn_partial_files(run_dir: Path) -> None:
    """Warn about ``.tmp`` files a killed write left behind (never those in flight now)."""
    for path in partial_files(run_dir):
        if not store.in_flight(path):
            warnings.warn(
                f"{path.name!r} in {str(run_dir)!r} is a partial file left by an interrupted "
                "write: it is never selected, loaded or resumed into, and a write that would "
                "land on it moves it aside first. Delete it when you no longer need it.",
                NitroWarning,
                stacklevel=3,
            )


def check_seed(seed: Any) -> int:
    """The seed to use (0 by default), refusing what the generators cannot take."""
    if seed is None:
        return 0
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ConfigError(
            f"seed={_echo(seed)} is not a seed; write an integer from 0 to 2**63 - 1, e.g. seed=0."
        )
    return seed


@contextmanager
def run_lock(run_dir: Path, run_id: str, main: bool) -> Iterator[bool]:
    """The run's lock on rank 0 (True when it holds it); the other ranks of a distributed
    run take none and go on (rank 0 refuses for the whole job)."""
    if not main:
        yield True
        return
    with store.run_lock(run_dir, run_id) as mine:
        yield mine


def reclaim_leftovers(store: RunStore) -> None:
    """Remove the run directory's leftovers of killed writes (:meth:`RunStore.reclaim`),
    saying what came back; a store that fails to list or delete is said and skipped (what
    is left is never read as a record, and the next run's reclaim tries again)."""
    try:
        found = store.reclaim()
    except ObjectStoreError as exc:
        warnings.warn(
            f"Could not reclaim leftovers of killed writes in {str(store)!r}: {exc} Training "
            "goes on; the next run's reclaim tries again.",
            NitroWarning,
            stacklevel=3,
        )
        return
    if found:
        warnings.warn(described(str(store), found), NitroWarning, stacklevel=3)
