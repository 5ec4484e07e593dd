"""Registered experiments: the names a client or a job may use, and nothing else.

The registry holds the built-in examples, the classes advertised under the
``nitro.experiments`` entry-point group by installed packages, and the Experiment
subclasses of the modules the operator names when starting a server or a command
(``--experiment-module``). A module is given as a dotted name importable from the root
(the root is appended to ``sys.path``, so its files never shadow installed modules) or as
a ``.py`` file inside the root, by its path relative to the root or absolute. A client's
text is only ever looked up here; it never names a module to import.

Each class is registered once, under its class name (under ``<module>.<name>`` only when
that name is taken already). A module that fails to import is recorded, not raised: its
error and the last lines of its traceback are kept, and a lookup of a name it gave before,
or of any unknown name while it is broken, raises that error. Each import reads the source
afresh (no bytecode cache is read or written), so an edited file is what runs next.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import re
import sys
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

from nitro_core.errors import ConfigError
from nitro_core.experiment import Experiment

ENTRY_POINT_GROUP = "nitro.experiments"
TRACEBACK_LINES = 8  # the last lines of a failed import's traceback that are kept
LINE_MAX = 240  # characters kept of one traceback line
_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
Stamp = tuple[int, int, int]  # mtime_ns, size, inode of a module's source file
FIX = (
    "Fix the file and call again: it is imported afresh when it changes "
    "(nitro_experiments shows the traceback)."
)


@dataclass(frozen=True)
class ModuleLoad:
    """One operator module's import: the Experiment classes it defines, or why it failed."""

    module: str  # as the operator wrote it
    classes: tuple[tuple[str, type[Experiment]], ...] = ()
    error: str | None = None  # e.g. "SyntaxError: invalid syntax (exps.py, line 3)"
    traceback: tuple[str, ...] = ()  # the last lines, paths shown relative to the root

    def reason(self) -> str:
        """The error, without a closing full stop (a sentence follows it)."""
        return (self.error or "").rstrip(".")


class Registry(dict[str, type[Experiment]]):
    """Name -> experiment class, with the operator modules' imports (failed ones included)
    and the names each broken module gave when it last imported."""

    def __init__(
        self,
        classes: Mapping[str, type[Experiment]],
        modules: Sequence[ModuleLoad] = (),
        remembered: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(classes)
        self.modules = tuple(modules)
        self.remembered = dict(remembered or {})  # experiment name -> module, while it is broken

    def names_of(self, load: ModuleLoad) -> list[str]:
        """The names under which ``load``'s classes are registered."""
        mine = {id(cls) for _, cls in load.classes}
        return sorted(name for name, cls in self.items() if id(cls) in mine)

    def broken(self) -> list[ModuleLoad]:
        return [m for m in self.modules if m.error is not None]


def builtin_experiments() -> tuple[dict[str, type[Experiment]], list[ModuleLoad]]:
    """The examples and the entry points' classes; an entry point that fails to load is
    recorded like a broken module."""
    from nitro_core.examples import EXAMPLES  # lazy: the examples import torch

    found: dict[str, type[Experiment]] = dict(EXAMPLES)
    failed = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            cls = ep.load()
        except (Exception, SystemExit) as exc:  # an installed package's bug never stops us
            failed.append(_failure(f"entry point {ep.name} = {ep.value}", exc, None))
            continue
        if inspect.isclass(cls) and issubclass(cls, Experiment):
            found[ep.name] = cls
    return found, failed


def load_registry(modules: Iterable[str] = (), root: str | Path | None = None) -> Registry:
    """Name -> experiment class, from the examples, entry points and operator modules
    (resolved against ``root``, default the working directory). Never raises for a module
    that fails to import: :func:`lookup` reports it."""
    base, failed = builtin_experiments()
    where = Path.cwd() if root is None else Path(root)
    return assemble(base, [*failed, *(load_module(m, where) for m in modules)])


def assemble(
    base: Mapping[str, type[Experiment]],
    loads: Sequence[ModuleLoad],
    remembered: Mapping[str, str] | None = None,
) -> Registry:
    """The registry of ``base`` plus each module's classes, once each: under the class
    name, or ``<module>.<name>`` when the class name is taken already."""
    found = dict(base)
    for load in loads:
        for name, cls in load.classes:
            found[name if name not in found else f"{_label(load.module)}.{name}"] = cls
    return Registry(found, loads, remembered)


def lookup(registry: Mapping[str, type[Experiment]], name: str) -> type[Experiment]:
    """The registered class called ``name``, or an error listing the registered names (and
    the import error of a broken module that gave, or may give, that name)."""
    try:
        return registry[name]
    except KeyError:
        pass
    broken = registry.broken() if isinstance(registry, Registry) else []
    owner = registry.remembered.get(name) if isinstance(registry, Registry) else None
    for load in broken:
        if load.module == owner:
            raise ConfigError(
                f"Experiment {name!r} comes from the experiment module {load.module!r}, which "
                f"failed to import: {load.reason()}. {FIX}"
            ) from None
    known = ", ".join(sorted(registry))
    message = (
        f"Unknown experiment {name!r}; registered experiments are: {known}. Use one of those "
        "names, or register yours with the 'nitro.experiments' entry-point group or "
        "--experiment-module when starting the server."
    )
    for load in broken:
        message += (
            f" The experiment module {load.module!r} failed to import and may define it: "
            f"{load.reason()}. {FIX}"
        )
    raise ConfigError(message) from None


# -- importing one operator module ------------------------------------------------------------
def is_file_module(module: str) -> bool:
    """A ``.py`` path (or anything with a path separator) rather than a dotted name."""
    return module.endswith(".py") or "/" in module or os.sep in module


def source_file(module: str, root: Path) -> Path | None:
    """The source file ``module`` imports from (None when it cannot be found): a file
    module's path, or the origin a dotted module's finder reports."""
    if is_file_module(module):
        path = _file_path(module, root)
        return path if path.is_file() else None
    if not _DOTTED.fullmatch(module):
        return None
    _importable(root)
    try:
        loaded = sys.modules.get(module)
        spec = loaded.__spec__ if loaded is not None else importlib.util.find_spec(module)
    except (Exception, SystemExit):  # a parent package that fails to import
        return None
    origin = getattr(spec, "origin", None)
    return Path(origin) if origin and origin.endswith(".py") else None


def source_stamp(module: str, root: Path) -> Stamp | None:
    """What changes when the module's source file is edited or replaced."""
    path = source_file(module, root)
    try:
        st = os.stat(path) if path is not None else None
    except OSError:
        return None
    return None if st is None else (st.st_mtime_ns, st.st_size, st.st_ino)


def load_module(module: str, root: Path) -> ModuleLoad:
    """Import ``module`` afresh (a dotted name, or a ``.py`` path relative to ``root`` or
    absolute inside it) and collect the Experiment subclasses it defines. Anything it
    prints goes to stderr (stdout may be the MCP channel); any failure is recorded."""
    root = Path(root).resolve()
    try:
        with contextlib.redirect_stdout(sys.stderr):
            loaded = _import(module, root)
    except _NotFound as exc:
        return ModuleLoad(module, error=str(exc))
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # the operator's code: any
        return _failure(module, exc, root)  # failure is reported, a raised Ctrl+C too
    classes = tuple(
        (name, cls)
        for name, cls in vars(loaded).items()
        if inspect.isclass(cls)
        and issubclass(cls, Experiment)
        and cls.__module__ == loaded.__name__
    )
    return ModuleLoad(module, classes=classes)


class _NotFound(Exception):
    """The module's file or name does not exist: an error without a traceback worth showing."""


class _FreshLoader(importlib.machinery.SourceFileLoader):
    """Compiles the source every time: no stale ``__pycache__`` read, none written into the
    operator's root."""

    def get_code(self, fullname: str) -> Any:
        path = self.get_filename(fullname)
        return self.source_to_code(self.get_data(path), path)


def _import(module: str, root: Path) -> ModuleType:
    _importable(root)
    if is_file_module(module):
        path = _file_path(module, root)
        if path != root and root not in path.parents:
            raise _NotFound(
                f"{str(path)!r} is outside the root {str(root)!r}; give a .py file inside the "
                "root, by its path relative to the root, e.g. 'experiments.py'"
            )
        if not path.is_file():
            raise _NotFound(
                f"there is no file {_shown(path, root)!r} under the root {str(root)!r}; give a "
                ".py file inside the root, by its path relative to the root, e.g. 'experiments.py'"
            )
        digest = hashlib.sha256(str(path).encode()).hexdigest()[:8]
        stem = re.sub(r"\W", "_", path.stem)
        return _exec_fresh(f"nitro_file_{stem}_{digest}", path, None)
    if not _DOTTED.fullmatch(module):
        raise _NotFound(
            f"{module!r} is neither a dotted module name nor a .py file path; write e.g. "
            "'my_pkg.experiments' or 'experiments.py'"
        )
    importlib.invalidate_caches()  # a module file created since the last look is found
    loaded = sys.modules.get(module)
    spec = loaded.__spec__ if loaded is not None else importlib.util.find_spec(module)
    if spec is None:
        raise _NotFound(
            f"ModuleNotFoundError: No module named {module!r}; give a module importable from "
            f"the root {str(root)!r} or the server's environment, or a .py file inside the "
            "root, e.g. 'experiments.py'"
        )
    if spec.origin and spec.origin.endswith(".py"):
        return _exec_fresh(module, Path(spec.origin), spec.submodule_search_locations)
    # the one import of a module by name: operator-given --experiment-module, never client text
    return importlib.import_module(module)  # compiled or namespace modules: the normal way


def _exec_fresh(name: str, path: Path, search: list[str] | None) -> ModuleType:
    """Run ``path`` as module ``name`` in a new module object, which replaces the old one in
    ``sys.modules`` only when it ran to the end."""
    loader = _FreshLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(
        name, path, loader=loader, submodule_search_locations=search
    )
    assert spec is not None  # a file location with a loader always gives a spec
    fresh = importlib.util.module_from_spec(spec)
    previous = sys.modules.get(name)
    sys.modules[name] = fresh  # the module's own classes resolve their annotations here
    try:
        loader.exec_module(fresh)
    except BaseException:
        if previous is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = previous
        raise
    return fresh


def _file_path(module: str, root: Path) -> Path:
    path = Path(module)
    return (path if path.is_absolute() else root / path).resolve()


def _importable(root: Path) -> None:
    """The root at the end of ``sys.path``: its modules import, and shadow nothing."""
    text = str(Path(root).resolve())
    if text not in sys.path:
        sys.path.append(text)


def _failure(module: str, exc: BaseException, root: Path | None) -> ModuleLoad:
    """The error on one line and the last lines of its traceback, importlib's own frames
    left out and paths inside the root shown relative to it."""
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith("<frozen") and f.filename != __file__
    ]
    lines = "".join(
        traceback.format_list(frames) + traceback.format_exception_only(exc)
    ).splitlines()
    error = lines[-1] if lines else type(exc).__name__
    where = (
        (exc.filename, exc.lineno) if isinstance(exc, SyntaxError) and exc.filename
        else (frames[-1].filename, frames[-1].lineno) if frames
        else None
    )  # fmt: skip
    if where is not None:
        error += f" ({where[0]}, line {where[1]})"
    tail = tuple(_clip(_relative(line, root)) for line in lines[-TRACEBACK_LINES:])
    return ModuleLoad(module, error=_clip(_relative(error, root)), traceback=tail)


def _relative(text: str, root: Path | None) -> str:
    return text if root is None else text.replace(f"{root}{os.sep}", "")


def _clip(text: str) -> str:
    return text if len(text) <= LINE_MAX else text[: LINE_MAX - 1] + "…"


def _shown(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def _label(module: str) -> str:
    """How a module prefixes a class whose name is taken: its dotted name, or a file's stem."""
    return Path(module).stem if is_file_module(module) else module
