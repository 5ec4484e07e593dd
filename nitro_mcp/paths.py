"""Every path a client names resolves inside the server's root, outside the server's own
state directory (``<root>/.nitro``: the job store), or is refused with a message saying
what to write instead. A path the file system would refuse (a name over 255 bytes, a path
over 4,095, characters it cannot encode, a file where a directory must be) is refused
here too, before anything is read or written."""

from __future__ import annotations

import os
from pathlib import Path
from typing import overload

from nitro_core.errors import ConfigError
from nitro_core.store.objects import ObjectUrl, parse
from nitro_core.store.place import on_disk, shown_from
from nitro_mcp.echo import clip

STATE_DIR = ".nitro"
NAME_MAX = 255  # bytes in one file or directory name (Linux, macOS)
PATH_MAX = 4096  # bytes in a whole path, with its terminating NUL
_EXAMPLES = {  # the argument, as a refusal writes it: save='runs/Classifier/avg10.safetensors'
    "save": "'runs/Classifier/avg10.safetensors'",
    "path": "'runs/Classifier/weights.safetensors'",
    "weights": "'runs/Classifier/weights.safetensors'",
    "resume": "'runs/Classifier/epoch-0003.safetensors'",
    "source": "'runs/Classifier/weights.safetensors'",
}


def example(what: str) -> str:
    """``e.g. run_dir='runs/Classifier'``: a value for the argument ``what``, written as the
    argument (as the value alone for an item of a list, such as ``sources[0]``)."""
    value = _EXAMPLES.get(what, "'runs/Classifier'")
    return f"e.g. {what}={value}" if what.isidentifier() else f"e.g. {value}"


def inside_root(root: Path, text: str, what: str) -> Path:
    """``text`` (relative to ``root``, or absolute) resolved with symlinks followed; refused
    when it lands outside ``root`` (``..``, an absolute path elsewhere, a symlink escape,
    a sibling such as ``<root>2``) or inside ``<root>/.nitro``."""
    if not isinstance(text, str) or not text.strip() or "\x00" in text:
        raise ConfigError(
            f"{what}={clip(text)} is not a path; give a path inside the server's root, {example(what)}."
        )
    candidate = on_disk(  # never a relative path "s3:/..." inside the root
        text,
        f"{what}={clip(text)} is a URL, and {what} takes a path here; give a path inside "
        f"the server's root, {example(what)}. (Run directories on object storage are taken "
        "as run_dir of nitro_train, nitro_validate, average, nitro_manifest, nitro_export "
        "and nitro_delete, and as path of nitro_checkpoint_info and nitro_verify, under the "
        "server's --storage.)",
    )
    _check_lengths(text, what)
    try:
        resolved = (candidate if candidate.is_absolute() else root / candidate).resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop, an unreadable directory
        raise ConfigError(
            f"{what}={clip(text)} cannot be resolved ({getattr(exc, 'strerror', None) or exc}); "
            f"give a plain path inside the server's root, {example(what)}."
        ) from None
    if resolved != root and root not in resolved.parents:  # by component, never by prefix
        raise ConfigError(
            f"{what}={clip(text)} resolves to {clip(str(resolved))}, outside the server's root "
            f"{str(root)!r}; give a path inside it, {example(what)}."
        )
    state = root / STATE_DIR
    if resolved == state or state in resolved.parents:
        raise ConfigError(
            f"{what}={clip(text)} is inside {STATE_DIR!r}, the server's own state directory (its "
            f"job store), which no tool reads or writes through a path; give a path outside it, "
            f"{example(what)}."
        )
    _check_lengths(str(resolved), what, echo=text)
    return resolved


def under_storage(allowed: tuple[ObjectUrl, ...], text: str, what: str) -> ObjectUrl:
    """The object-store URL ``text``, refused unless it lies under one of the prefixes
    ``allowed`` (the server's ``--storage s3://bucket/prefix``: every URL a client names is
    confined under it, as every path is under the root), by whole key segments."""
    if not allowed:
        raise ConfigError(
            f"{what}={clip(text)} is on object storage, which this server was not started "
            f"with; give a path inside the server's root, {example(what)}, or start the server "
            "with nitro serve --storage s3://bucket/prefix to allow URLs under that prefix."
        )
    url = parse(text, what)
    if not any(_holds(prefix, url) for prefix in allowed):
        storage = allowed[0]
        raise ConfigError(
            f"{what}={clip(text)} lies outside the server's storage {str(storage)!r}; give a "
            f"URL under it, e.g. {what}='{storage.child('runs/Classifier')}'."
        )
    return url


def _holds(prefix: ObjectUrl, url: ObjectUrl) -> bool:
    """Whether ``url`` lies under ``prefix``, by whole key segments."""
    return url.bucket == prefix.bucket and (
        not prefix.key or url.key == prefix.key or url.key.startswith(prefix.key + "/")
    )


def directory_inside_root(root: Path, text: str, what: str) -> Path:
    """A directory inside the root (``inside_root``), refused when it or the nearest of its
    parents that exists is a file: nothing could be read or created there."""
    resolved = inside_root(root, text, what)
    blocker = file_in_the_way(resolved)
    if blocker is not None:
        where = (
            "is a file"
            if blocker == resolved
            else f"lies under the file {clip(shown(root, blocker))}"
        )
        raise ConfigError(
            f"{what}={clip(text)} {where}, not a directory; give a directory (it is created "
            f"when missing), {example(what)}."
        )
    return resolved


def file_in_the_way(path: Path) -> Path | None:
    """The nearest of ``path`` and its parents that exists and is not a directory."""
    for candidate in (path, *path.parents):
        if candidate.is_dir():
            return None
        if candidate.exists():
            return candidate
    return None


@overload
def shown(root: Path, path: Path | str) -> str: ...
@overload
def shown(root: Path, path: None) -> None: ...
@overload
def shown(root: Path, path: Path | str | None) -> str | None: ...
def shown(root: Path, path: Path | str | None) -> str | None:
    """A path as the client should see it: relative to the root when inside it."""
    if path is None:
        return None
    return shown_from(root, path)  # an object-store URL is shown as it is


def _check_lengths(text: str, what: str, echo: str | None = None) -> None:
    try:
        encoded = os.fsencode(text)
    except UnicodeError:
        raise ConfigError(
            f"{what}={clip(echo or text)} holds characters that cannot be a file name here; "
            f"give a path of plain characters, {example(what)}."
        ) from None
    if len(encoded) >= PATH_MAX:
        raise ConfigError(
            f"{what}={clip(echo or text)} is {len(encoded)} bytes long; a path is at most "
            f"{PATH_MAX - 1} bytes here. Give a shorter path, {example(what)}."
        )
    for part in encoded.split(b"/"):
        if len(part) > NAME_MAX:
            raise ConfigError(
                f"{what}={clip(echo or text)} has a name of {len(part)} bytes "
                f"({clip(os.fsdecode(part), 20)}); a file or directory name is at most "
                f"{NAME_MAX} bytes. Give a shorter name, {example(what)}."
            )
