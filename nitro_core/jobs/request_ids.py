"""Idempotent calls: ``nitro_train(..., request_id="...")`` starts at most one job per id.

A client that retries a call after a timeout or a dropped connection cannot tell whether the
first attempt started a job; with the same ``request_id`` the retry gets the job the first
attempt started (``duplicate``), not a second run. The ids live in the job store, one file
each (``.nitro/requests/<digest>.json``: the id, the job, a digest of the call), so they
hold across server restarts and between servers sharing a root. Claims are made under one
lock file, so two attempts racing each other start one job. An id sent with another call is
refused (it names another piece of work); an id whose job was pruned from the store is free
again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from nitro_core.errors import CheckpointNotFound, ConfigError
from nitro_core.jobs.files import locked, read_model, real_dir, write_json

log = logging.getLogger(__name__)
T = TypeVar("T")

REQUESTS = "requests"  # under the store (.nitro): one file per request id
REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
REQUEST_ID_REFUSAL = (
    "request_id={value} is not a request id; send 1 to 128 letters, digits, '.', '_', ':' "
    "or '-' (starting with a letter or digit), e.g. request_id='sweep-7-lr3e-4', the same "
    "for each retry of one call."
)


class RequestClaim(BaseModel):
    """What a request id started: its job (or seed group) and a digest of the call as sent."""

    request_id: str
    job_id: str  # a job's id, or a seed group's (group-...)
    call: str


def call_digest(arguments: dict[str, Any]) -> str:
    """A digest of a call's arguments (their JSON, keys sorted): retries of one call agree."""
    text = json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def once(
    store_dir: Path,
    request_id: str,
    digest: str,
    find: Callable[[str], T],
    start: Callable[[], T],
    id_of: Callable[[T], str] = lambda status: status.job_id,  # type: ignore[attr-defined]
) -> tuple[T, bool]:
    """What ``request_id`` started (``True``: a duplicate), else what ``start()`` starts,
    recorded for the id. ``digest``: the call's (:func:`call_digest`); ``find``: what was
    started, by its id (a job's status; a seed group), :class:`CheckpointNotFound` when it
    is gone; ``id_of``: the id of what ``start`` returns."""
    if not isinstance(request_id, str) or not REQUEST_ID.fullmatch(request_id):
        raise ConfigError(REQUEST_ID_REFUSAL.format(value=json.dumps(request_id)[:140]))
    directory = store_dir / REQUESTS
    if not (real_dir(store_dir) and real_dir(directory)):  # a link is refused, not followed
        directory.mkdir(parents=True, exist_ok=True)
    name = f"{hashlib.sha256(request_id.encode()).hexdigest()[:32]}.json"
    with locked(store_dir, "requests.lock"):
        claim = _claim(directory, name)
        if claim is not None and claim.request_id == request_id:
            if claim.call != digest:
                raise ConfigError(
                    f"request_id={request_id!r} was sent with another call, which started job "
                    f"{claim.job_id}; a request id names one call and its retries. Send this "
                    "call with a new request_id, or resend that call unchanged to get its job."
                )
            try:
                return find(claim.job_id), True
            except CheckpointNotFound:
                pass  # its job was pruned from the store: the id is free again
        started = start()
        claim = RequestClaim(request_id=request_id, job_id=id_of(started), call=digest)
        write_json(directory / name, claim)
        return started, False


def _claim(directory: Path, name: str) -> RequestClaim | None:
    """The claim filed under ``name``; none when there is none (or it is not readable: a
    file Nitro did not write is replaced, as a pruned job's claim is)."""
    try:
        return read_model(directory, name, RequestClaim)
    except FileNotFoundError:
        return None
    except ValueError:
        log.warning("%s is not a request claim Nitro wrote; it is replaced", directory / name)
        return None


__all__ = ["REQUEST_ID_REFUSAL", "RequestClaim", "call_digest", "once"]
