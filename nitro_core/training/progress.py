"""A one-line progress bar on stderr, shown only on an interactive terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Throttled to ten redraws a second; silent when ``stream`` is not a TTY."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self._next = 0.0

    def update(self, epoch: int, max_epochs: int, done: int, total: int | None) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now < self._next and done != total:
            return
        self._next = now + 0.1
        frac = done / total if total else 0.0
        bar = "#" * int(20 * frac)
        of = f"/{total}" if total else ""
        self.stream.write(f"\repoch {epoch}/{max_epochs} [{bar:<20}] {done}{of}")
        self.stream.flush()

    def epoch_end(self, summary: str) -> None:
        if self.enabled:
            self.stream.write(f"\r{summary:<60}\n")
            self.stream.flush()
