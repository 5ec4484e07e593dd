"""The server's experiments, kept in step with the operator's module files.

``--experiment-module`` names modules (dotted, or ``.py`` paths inside the root) that the
server imports at start; a module that fails to import is listed with its error, never fatal.
Before each call that needs the registry, each module's source file is looked at (its
mtime, size and inode): an edited, created or replaced file is imported again, so the
fields a call is checked against are the fields the worker (which imports the file afresh)
will run. A module that failed is tried again when its file changes, or at most every
``RETRY_S`` seconds (a missing dependency may have been installed since).

An operator's module never stops the server: it is imported on a thread of its own, for at
most ``import_timeout_s`` seconds (``nitro serve --import-timeout``), with stdin read from
/dev/null and file descriptor 1 (the MCP stdio channel, before the server claims it) pointed
at stderr; a module that hangs, waits for input, raises ``KeyboardInterrupt`` or writes to
fd 1 is listed with that as its error. A hung import is not started again until its file
changes.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from nitro_core.experiment import Experiment, host_fields
from nitro_core.registry import (
    FIX,
    ModuleLoad,
    Registry,
    Stamp,
    assemble,
    builtin_experiments,
    is_file_module,
    load_module,
    lookup,
    source_stamp,
)
from nitro_mcp import models
from nitro_mcp.echo import clip_text
from nitro_mcp.replies import fit, shrink

RETRY_S = 2.0
IMPORT_TIMEOUT_S = 30.0  # the longest a module's import may take before it counts as failed
EXPERIMENTS_BUDGET = 5_000  # characters of experiment descriptions in the default listing
MODULES_BUDGET = 2_000  # and of the modules, errors and tracebacks included
DESCRIPTION_MAX = 300  # characters of an experiment's description


class ExperimentModules:
    """The registry over ``root``: built-ins, entry points and the operator's modules."""

    def __init__(
        self, root: Path, modules: tuple[str, ...] = (), import_timeout_s: float = IMPORT_TIMEOUT_S
    ) -> None:
        self.root = Path(root).resolve()
        self.modules = tuple(dict.fromkeys(modules))  # each module once, in the given order
        self.import_timeout_s = import_timeout_s
        self._hung: dict[str, threading.Thread] = {}  # imports still running past the limit
        self._base: dict[str, type[Experiment]] | None = None  # loaded at the first use
        self._failed_base: list[ModuleLoad] = []
        self._lock = threading.Lock()
        self._loads: dict[str, ModuleLoad] = {}
        self._stamps: dict[str, Stamp | None] = {}
        self._tried: dict[str, float] = {}
        self._remembered: dict[str, str] = {}  # experiment name -> the module that gave it
        self._registry: Registry | None = None  # the first use imports (a server lists first)

    def for_jobs(self) -> list[str]:
        """The modules as a job's spec names them: a file by its absolute path (a worker
        imports it from there whatever its working directory), a dotted name as given."""
        return [
            str(self.root / m) if is_file_module(m) and not Path(m).is_absolute() else m
            for m in self.modules
        ]

    def registry(self) -> Registry:
        """The current registry: the same object until a module is imported again."""
        with self._lock:
            changed = False
            if self._base is None:  # the examples and entry points: torch loads here
                self._base, self._failed_base = builtin_experiments()
            for module in self.modules:
                stamp = source_stamp(module, self.root)
                load = self._loads.get(module)
                hung = self._hung.get(module)
                retry = (
                    load is not None
                    and load.error is not None
                    and time.monotonic() - self._tried[module] >= RETRY_S
                    and (hung is None or not hung.is_alive())  # never a second hung import
                )
                if load is None or stamp != self._stamps[module] or retry:
                    self._load(module, stamp)
                    changed = True
            if changed or self._registry is None:
                loads = [*self._failed_base, *(self._loads[m] for m in self.modules)]
                broken = {m for m in self.modules if self._loads[m].error is not None}
                remembered = {n: m for n, m in self._remembered.items() if m in broken}
                self._registry = assemble(self._base, loads, remembered)
                for load in loads:  # a module's names, remembered for when it breaks
                    if load.error is None:
                        self._remembered.update(
                            (n, load.module) for n in self._registry.names_of(load)
                        )
            return self._registry

    def _load(self, module: str, stamp: Stamp | None) -> None:
        self._loads[module], hung = timed_load(module, self.root, self.import_timeout_s)
        if hung is not None:
            self._hung[module] = hung
        # the stamp seen before the import: an edit made while importing is seen next time
        self._stamps[module] = stamp
        self._tried[module] = time.monotonic()


def timed_load(module: str, root: Path, limit: float) -> tuple[ModuleLoad, threading.Thread | None]:
    """``load_module`` on a daemon thread, for at most ``limit`` seconds, with stdin from
    /dev/null and fd 1 on stderr meanwhile; the load (an error when it ran past the limit)
    and the thread when it is still running."""
    done: list[ModuleLoad] = []

    def run() -> None:
        try:
            done.append(load_module(module, root))
        except BaseException as exc:  # noqa: BLE001 - whatever the module raises is its error
            done.append(ModuleLoad(module, error=f"{type(exc).__name__}: {exc}"))

    thread = threading.Thread(target=run, name=f"nitro-import {module}", daemon=True)
    stdout = sys.stdout
    with _quiet_descriptors():
        thread.start()
        thread.join(limit)
    if done:
        return done[0], None
    sys.stdout = stdout  # the hung import's redirect of print() to stderr ends here
    return ModuleLoad(module, error=(
        f"the import did not finish within {limit:g} s (does it wait for input, a lock or the "
        "network at import?); move that work out of the import, or raise the limit with "
        "nitro serve --import-timeout"
    )), thread  # fmt: skip


@contextlib.contextmanager
def _quiet_descriptors() -> Iterator[None]:
    """fd 0 reads /dev/null and fd 1 writes to stderr, restored on the way out (in place
    when a descriptor cannot be duplicated)."""
    try:
        saved = (os.dup(0), os.dup(1))
        null = os.open(os.devnull, os.O_RDONLY)
    except OSError:
        yield
        return
    sys.stdout.flush()  # what Python buffered for fd 1 goes where it was meant to
    try:
        os.dup2(null, 0)
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved[0], 0)
        os.dup2(saved[1], 1)
        for fd in (*saved, null):
            os.close(fd)


def listing(
    registry: Registry,
    described: Callable[[list[str]], dict[str, tuple[list[str] | None, Any]]],
    name: str | None = None,
) -> models.ExperimentsResult:
    """``nitro_experiments``: each experiment (or the one called ``name``) with its fields,
    splits and monitor, as many as fit the reply's budget (the rest by name, with ``next``),
    and the operator's modules with their import errors."""
    if name is not None:  # an unknown name is refused with the registered ones (cut: echoed)
        lookup(registry, name if name in registry else clip_text(name))
    names = sorted(registry) if name is None else [name]
    facts = described(names)  # splits and monitor, from the experiments' own code elsewhere
    infos = [_describe(n, registry[n], *facts[n]) for n in names]
    shown_n = fit(infos, len(infos), budget=EXPERIMENTS_BUDGET)
    more = names[shown_n:]
    nxt = None
    if more:
        nxt = (
            f"{len(more)} more experiments, listed by name in 'more': "
            f"nitro_experiments(name={more[0]!r}) describes one."
        )
    modules = module_infos(registry) if name is None else []
    return models.ExperimentsResult(
        experiments=infos[:shown_n], more=more, modules=shrink_modules(modules), next=nxt
    )


def _describe(
    name: str, cls: type[Experiment], splits: list[str] | None, monitor: Any
) -> models.ExperimentInfo:
    host = host_fields(cls)
    fields = [
        models.FieldInfo(
            name=f,
            type=_type_name(info.annotation),
            default=_jsonable(info.get_default(call_default_factory=True)),
            host=f in host,
        )
        for f, info in cls.model_fields.items()
    ]
    return models.ExperimentInfo(
        name=name,
        description=(cls.__doc__ or "").strip().split("\n\n")[0][:DESCRIPTION_MAX],
        fields=fields,
        splits=splits,
        monitor=monitor if isinstance(monitor, list) else None,
    )


def shrink_modules(
    infos: list[models.ExperimentModuleInfo],
) -> list[models.ExperimentModuleInfo]:
    """The module list within its share of the budget: tracebacks are cut to their last
    two lines first, then the list itself (a server has a handful of modules)."""
    if fit(infos, len(infos), budget=MODULES_BUDGET) < len(infos):
        infos = [m.model_copy(update={"traceback": m.traceback[-2:]}) for m in infos]
    return infos[: fit(infos, len(infos), budget=MODULES_BUDGET)]


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def _jsonable(value: Any) -> Any:
    if isinstance(value, str | int | float | bool | type(None) | list | dict):
        return shrink(value, 200)
    return clip_text(repr(value), 200)


def module_infos(registry: Registry) -> list[models.ExperimentModuleInfo]:
    """Each operator module (and failed entry point): the names it registers, or its error
    and the last lines of its traceback."""
    return [
        models.ExperimentModuleInfo(
            module=load.module,
            experiments=registry.names_of(load),
            error=load.error,
            traceback=list(load.traceback),
            next=None if load.error is None else FIX,
        )
        for load in registry.modules
    ]
