"""Every path a client names resolves inside the server's root, or is refused."""

from __future__ import annotations

from pathlib import Path

from nitro_core.errors import ConfigError


def inside_root(root: Path, text: str, what: str) -> Path:
    """``text`` (relative to ``root``, or absolute) resolved with symlinks followed; refused
    when it lands outside ``root`` (``..``, an absolute path elsewhere, a symlink escape)."""
    if not isinstance(text, str) or not text.strip() or "\x00" in text:
        raise ConfigError(
            f"{what}={text!r} is not a path; give a path inside the server's root, e.g. 'runs/Classifier'."
        )
    candidate = Path(text)
    resolved = (candidate if candidate.is_absolute() else root / candidate).resolve()
    if resolved != root and root not in resolved.parents:
        raise ConfigError(
            f"{what}={text!r} resolves to {str(resolved)!r}, outside the server's root {str(root)!r}; "
            "give a path inside it, e.g. 'runs/Classifier'."
        )
    return resolved


def shown(root: Path, path: Path | str | None) -> str | None:
    """A path as the client should see it: relative to the root when inside it."""
    if path is None:
        return None
    p = Path(path)
    try:
        return str(p.resolve().relative_to(root))
    except ValueError:
        return str(p)
