"""How a client's input is echoed in an error message: in full when short, cut at
``LIMIT`` characters with an ellipsis when long, so a hostile argument never fills a reply."""

from __future__ import annotations

from typing import Any

LIMIT = 80


def clip(value: Any, limit: int = LIMIT) -> str:
    """``repr(value)``, cut to about ``limit`` characters (``'aaaa…'``)."""
    if isinstance(value, str):
        return repr(value if len(value) <= limit else value[:limit] + "…")
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 3 * limit:
        # repr of an integer over 4300 digits raises; say how long it is instead
        return f"(an integer of about {int(value.bit_length() * 0.30103) + 1} digits)"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def clip_text(text: str, limit: int = LIMIT) -> str:
    """``text`` itself (no quotes), cut to ``limit`` characters with an ellipsis."""
    return text if len(text) <= limit else text[:limit] + "…"
