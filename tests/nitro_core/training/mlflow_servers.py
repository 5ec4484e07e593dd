"""MLflow tracking servers for tests, on 127.0.0.1 and a SQLite store: ``mlflow server`` as
a process of its own (stopped by its pid), and MLflow's own server app served from a thread
of the test's process (stopped, its port closed, and started again on that port in a
moment). Nothing leaves 127.0.0.1."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

QUIET = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true", "WANDB_SILENT": "true"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answering(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


@contextmanager
def server_process(root: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``mlflow server`` on a SQLite store in ``root`` and a free port, waited for until it
    answers; (its URI, its process), stopped by its pid (its process group) at the end
    unless the test already did."""
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    log = open(root / "server.log", "wb")  # noqa: SIM115
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("mlflow")), "server",
         "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
         "--default-artifact-root", str(root / "artifacts"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=root,
        env={**os.environ, **QUIET},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not answering(uri):
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not answer: {(root / 'server.log').read_text()}")
            time.sleep(0.2)  # poll again: the state waited for is the server answering
        yield uri, server
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
        log.close()


def kill(server: subprocess.Popen[bytes]) -> None:
    """SIGKILL the server's process group, and wait until it is gone."""
    os.killpg(server.pid, signal.SIGKILL)
    server.wait()


class AppServer:
    """MLflow's tracking server app (Flask, its own handlers and store: the one
    ``_MLFLOW_SERVER_FILE_STORE`` names) served by werkzeug from a thread. ``stop()``
    returns once its port is closed; ``start()`` again serves on the same port."""

    def __init__(self, app: Any) -> None:
        self.app, self.port = app, 0
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> AppServer:
        from werkzeug.serving import WSGIRequestHandler, make_server

        class Quiet(WSGIRequestHandler):
            def log(self, *args: Any) -> None:  # no request lines on stderr
                pass

        self._server = make_server(
            "127.0.0.1", self.port, self.app, threaded=True, request_handler=Quiet
        )
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()  # its serving loop has ended
        self._server.server_close()  # and its port is closed: a connection is refused
        assert self._thread is not None
        self._thread.join()


@contextmanager
def silent_listener(port: int) -> Iterator[socket.socket]:
    """A socket listening on ``port`` that never accepts: a connection opens (the kernel
    completes it) and a request is never answered, as on a hung server."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(64)
        yield s
