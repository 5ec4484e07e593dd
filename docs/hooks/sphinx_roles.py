"""MkDocs hook: the docstrings write cross-references Sphinx-style (:class:`Pair`); mkdocstrings
renders the name as code and leaves the role in front of it. Drop the role, and the ``~``
that asks Sphinx for the short name."""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):<code>~?")


def on_page_content(html: str, **kwargs: Any) -> str:
    return _ROLE.sub("<code>", html)
