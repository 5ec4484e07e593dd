"""Calls to an experiment tracker, each bounded in time, and the probe of its server.

A tracker is a side channel: a server that is down or hangs must cost a run one bounded
wait, never the run. Every call (:func:`bounded`) runs on a daemon thread of its own and is
waited for at most :func:`timeout` seconds (``NITRO_TRACKER_TIMEOUT_S``, default
:data:`DEFAULT_TIMEOUT_S`). A call still running then is left to end on its own: its thread
never holds the process at exit (MLflow's client retries a refused connection for about
four minutes, W&B's ``init`` for 90 s), and its caller goes on. The probe
(:func:`unreachable`) asks an HTTP(S) server for any answer within the same bound; only the
lack of one counts (a 404 or a 401 is an answer: the tracker's own client then says what is
wrong).
"""

from __future__ import annotations

import math
import os
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

from nitro_core.errors import ConfigError

TIMEOUT_VAR = "NITRO_TRACKER_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 10.0

T = TypeVar("T")


def timeout() -> float:
    """The seconds one tracker call may take: ``NITRO_TRACKER_TIMEOUT_S``, else the default;
    anything but a positive number is refused, naming the variable."""
    raw = os.environ.get(TIMEOUT_VAR, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(
            f"{TIMEOUT_VAR}={raw!r} is not a number of seconds: it bounds each call to an "
            f"experiment tracker. Set it to a positive number such as {TIMEOUT_VAR}=30, or "
            f"unset it for the default ({DEFAULT_TIMEOUT_S:g})."
        )
    return value


def bounded(call: Callable[[], T], seconds: float) -> T:
    """``call()``'s result, or its exception; ``TimeoutError`` when it has not returned
    within ``seconds`` (it keeps running on its daemon thread, which nothing waits for)."""
    done = threading.Event()
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # handed to the caller, whatever it is
            outcome.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=run, name="nitro-tracker-call", daemon=True).start()
    if not done.wait(seconds):
        raise TimeoutError(f"no answer within {seconds:g} s")
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def unreachable(url: str, seconds: float) -> str | None:
    """Why ``url`` gives no HTTP answer within ``seconds`` (None: it answered, with any
    status, or a TLS handshake that the tracker's own client judges)."""

    def ask() -> None:
        with urllib.request.urlopen(url, timeout=seconds + 1):  # noqa: S310  # http(s) only
            pass  # the bound is bounded()'s; the socket's own is a backstop

    try:
        bounded(ask, seconds)
    except urllib.error.HTTPError:  # a status is an answer
        return None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ssl.SSLError):  # something answered the handshake
            return None
        cause = exc.reason
        return reason(cause, seconds) if isinstance(cause, BaseException) else str(cause)
    except Exception as exc:  # no answer in time, a reset
        return reason(exc, seconds)
    return None


def reason(exc: BaseException, seconds: float) -> str:
    """A failed call's cause, in a few words: ``connection refused``, ``no answer within
    10 s (NITRO_TRACKER_TIMEOUT_S)`` (``seconds``), else the exception's type and first
    line."""
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return f"no answer within {seconds:g} s ({TIMEOUT_VAR})"
    first = str(exc).strip().splitlines()[0].rstrip(".") if str(exc).strip() else ""
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."
