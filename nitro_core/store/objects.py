"""Objects on S3-compatible storage: the URLs Nitro accepts, and the few calls it makes.

A run directory may be ``s3://bucket/prefix/run``. Credentials, region and endpoint come
from the standard AWS settings, read by botocore as the AWS CLI reads them
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE`` and ``~/.aws``,
``AWS_ENDPOINT_URL`` for an S3-compatible server such as SeaweedFS, MinIO or Ceph).

The calls are S3's own, through botocore: ranged ``GET``, ``PUT`` with ``If-None-Match: *``
(an object created under a name never used, or nothing) and with ``If-Match: <etag>`` (an
object replaced only if nobody replaced it since it was read), multipart uploads completed
under the same condition (a partial upload is never visible), ``DELETE`` and listing. There
is no rename on object storage and Nitro never emulates one. Torch-free; boto3 is the
``s3`` extra (``pip install 'nitro[s3]'``).
"""

from __future__ import annotations

import functools
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from nitro_core.errors import ConfigError, ObjectStoreError
from nitro_core.store.safeio import READ_LIMITS, too_large

SCHEME = "s3://"
PART = 16 * 1024 * 1024  # bytes per part of an upload or a ranged read; below it: one PUT
WORKERS = 4  # parts in flight at once (memory: WORKERS * PART)
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")


def is_url(value: object) -> bool:
    """Whether ``value`` names a location by URL (``s3://...``, or a scheme Nitro refuses)
    rather than a local path."""
    return isinstance(value, str) and _SCHEME.match(value) is not None


@dataclass(frozen=True)
class ObjectUrl:
    """``s3://bucket/key``: a run directory (its key a prefix) or one object in it."""

    bucket: str
    key: str  # no leading or trailing "/"

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.key}" if self.key else f"{SCHEME}{self.bucket}"

    def child(self, name: str) -> ObjectUrl:
        return ObjectUrl(self.bucket, f"{self.key}/{name}" if self.key else name)

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> ObjectUrl:
        return ObjectUrl(self.bucket, self.key.rsplit("/", 1)[0] if "/" in self.key else "")

    def shown(self) -> ObjectPath:
        """This URL as a path in messages (``str`` gives the URL back)."""
        return ObjectPath("/" + self.bucket + ("/" + self.key if self.key else ""))


class ObjectPath(PurePosixPath):
    """A URL where the record readers' messages expect a path: ``str`` is the URL and
    ``parent`` the run directory's URL."""

    def __str__(self) -> str:
        return SCHEME + super().__str__().lstrip("/")


def parse(text: str, what: str = "run_dir") -> ObjectUrl:
    """The URL ``text`` parsed, or a :class:`ConfigError` saying what to write."""
    m = _SCHEME.match(text)
    if m is None or m.group(1).lower() != "s3":
        scheme = m.group(1) if m else ""
        raise ConfigError(
            f"{what}={text!r}: {scheme + '://' if scheme else 'this'} is not a storage Nitro "
            "writes to. Write a local path, or s3://bucket/prefix for S3-compatible object "
            "storage (endpoint and credentials from AWS_ENDPOINT_URL and the AWS settings)."
        )
    rest = text[len(m.group(0)) :]
    bucket, _, key = rest.partition("/")
    parts = [p for p in key.split("/") if p]
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise ConfigError(
            f"{what}={text!r} names no valid bucket ({bucket!r}): a bucket name is 3 to 63 "
            "lowercase letters, digits, dots and hyphens; write s3://my-bucket/prefix/run."
        )
    if any(p in (".", "..") for p in parts) or "\\" in key or "//" in key.strip("/"):
        raise ConfigError(
            f"{what}={text!r} has an empty, '.' or '..' segment in its key; write each "
            "segment once, e.g. s3://my-bucket/prefix/run."
        )
    return ObjectUrl(bucket, "/".join(parts))


@dataclass
class Got:
    """An object's bytes and the ETag they had (the condition of a replace)."""

    body: bytes
    etag: str


class Bucket:
    """The calls Nitro makes on one bucket, through one botocore client; errors come back
    as :class:`ConfigError` (no such bucket, no credentials, no endpoint) or
    :class:`ObjectStoreError` (what the server answered otherwise), each saying what to do."""

    def __init__(self, bucket: str, client: Any) -> None:
        self.name, self.client = bucket, client

    def get(self, key: str, what: str) -> Got | None:
        """The whole object, or None when there is none; refused (:func:`safeio.too_large`)
        by its length, before its body is read, when longer than the limit for ``what``."""
        try:
            r = self._call("get_object", Key=key)
        except _NoSuchKey:
            return None
        size = int(r.get("ContentLength") or 0)
        limit = READ_LIMITS[what]
        if size > limit:
            r["Body"].close()  # the connection is dropped, not drained
            raise too_large(what, f"s3://{self.name}/{key}", size)
        body: bytes = r["Body"].read(limit + 1)
        if len(body) > limit:
            raise too_large(what, f"s3://{self.name}/{key}", len(body))
        return Got(body, r["ETag"])

    def get_range(self, key: str, start: int, stop: int) -> bytes:
        """Bytes ``start`` to ``stop`` (exclusive) of the object; fewer when it is shorter."""
        if stop <= start:
            return b""
        try:
            r = self._call("get_object", Key=key, Range=f"bytes={start}-{stop - 1}")
        except _NoSuchKey:
            raise FileNotFoundError(f"s3://{self.name}/{key}") from None
        except ObjectStoreError as e:
            if "InvalidRange" in str(e):  # past the end
                return b""
            raise
        body: bytes = r["Body"].read()
        return body

    def size(self, key: str) -> int | None:
        """The object's size, or None when there is none."""
        try:
            return int(self._call("head_object", Key=key)["ContentLength"])
        except _NoSuchKey:
            return None

    def create(self, key: str, body: bytes) -> str | None:
        """Create the object with ``body`` if no object has this name; its ETag, or None when
        one exists (``If-None-Match: *``)."""
        try:
            return str(self._call("put_object", Key=key, Body=body, IfNoneMatch="*")["ETag"])
        except _Precondition:
            return None

    def replace(self, key: str, body: bytes, etag: str) -> str | None:
        """Replace the object with ``body`` if it still has ``etag``; its new ETag, or None
        when another writer replaced (or deleted) it since (``If-Match``)."""
        try:
            return str(self._call("put_object", Key=key, Body=body, IfMatch=etag)["ETag"])
        except (_Precondition, _NoSuchKey):
            return None

    def upload_new(self, key: str, path: str, size: int) -> bool:
        """Upload the file ``path`` (``size`` bytes) as a new object named ``key``, whole or
        not at all: one conditional PUT below :data:`PART`, else a multipart upload (its
        parts sent by :data:`WORKERS` threads) completed with ``If-None-Match: *`` and
        aborted on any failure, so its parts are never an object. False when an object of
        that name exists."""
        fd = os.open(path, os.O_RDONLY)
        try:
            if size < PART:
                return self.create(key, os.pread(fd, size, 0)) is not None
            return self._multipart(key, fd, size)
        finally:
            os.close(fd)

    def _multipart(self, key: str, fd: int, size: int) -> bool:
        part = max(PART, -(-size // 10_000))  # S3 takes at most 10,000 parts
        upload = self._call("create_multipart_upload", Key=key)["UploadId"]

        def send(number: int) -> dict[str, Any]:
            body = os.pread(fd, part, (number - 1) * part)
            r = self._call("upload_part", Key=key, UploadId=upload, PartNumber=number, Body=body)
            return {"PartNumber": number, "ETag": r["ETag"]}

        try:
            with ThreadPoolExecutor(WORKERS, thread_name_prefix="nitro-upload") as pool:
                parts = list(pool.map(send, range(1, -(-size // part) + 1)))
            self._call(
                "complete_multipart_upload", Key=key, UploadId=upload,
                MultipartUpload={"Parts": parts}, IfNoneMatch="*",
            )  # fmt: skip
            return True
        except _Precondition:
            self._abort(key, upload)
            return False
        except BaseException:
            self._abort(key, upload)
            raise

    def download(self, key: str, size: int, fd: int) -> None:
        """Write the object's ``size`` bytes into ``fd`` by ranged reads of :data:`PART`
        bytes, :data:`WORKERS` at once."""
        self.download_ranges(key, [(a, min(size, a + PART)) for a in range(0, size, PART)], fd)

    def download_ranges(self, key: str, ranges: list[tuple[int, int]], fd: int) -> None:
        """Write bytes ``start`` to ``stop`` of the object, for each range, at the same
        offsets of ``fd`` (ranges of at most :data:`PART` bytes, :data:`WORKERS` at once)."""

        def take(span: tuple[int, int]) -> None:
            start, stop = span
            body = self.get_range(key, start, stop)
            if len(body) != stop - start:
                raise ObjectStoreError(
                    f"s3://{self.name}/{key} changed size while it was read; read it again."
                )
            os.pwrite(fd, body, start)

        with ThreadPoolExecutor(WORKERS, thread_name_prefix="nitro-download") as pool:
            list(pool.map(take, ranges))

    def delete(self, key: str) -> None:
        self._call("delete_object", Key=key)

    def keys(self, prefix: str, limit: int | None = None) -> list[str]:
        """The keys of the objects under ``prefix`` (at most ``limit``), in key order."""
        found: list[str] = []
        token: dict[str, str] = {}
        while limit is None or len(found) < limit:
            r = self._call("list_objects_v2", Prefix=prefix, **token)
            found += [o["Key"] for o in r.get("Contents", ())]
            if not r.get("IsTruncated"):
                break
            token = {"ContinuationToken": r["NextContinuationToken"]}
        return found if limit is None else found[:limit]

    def listing(self, prefix: str) -> list[tuple[str, int, float]]:
        """(key, size, last modified as a POSIX time) of every object under ``prefix``."""
        found: list[tuple[str, int, float]] = []
        token: dict[str, str] = {}
        while True:
            r = self._call("list_objects_v2", Prefix=prefix, **token)
            found += [
                (o["Key"], int(o.get("Size", 0)), o["LastModified"].timestamp())
                for o in r.get("Contents", ())
            ]
            if not r.get("IsTruncated"):
                return found
            token = {"ContinuationToken": r["NextContinuationToken"]}

    def uploads(self, prefix: str) -> list[tuple[str, str, float]]:
        """(key, upload id, initiated as a POSIX time) of every multipart upload under
        ``prefix`` that was neither completed nor aborted."""
        found: list[tuple[str, str, float]] = []
        token: dict[str, str] = {}
        while True:
            r = self._call("list_multipart_uploads", Prefix=prefix, **token)
            found += [
                (u["Key"], u["UploadId"], u["Initiated"].timestamp()) for u in r.get("Uploads", ())
            ]
            if not r.get("IsTruncated"):
                return found
            token = {"KeyMarker": r["NextKeyMarker"], "UploadIdMarker": r["NextUploadIdMarker"]}

    def part_times(self, key: str, upload: str) -> list[float]:
        """When each part of the multipart upload ``upload`` of ``key`` was last written."""
        r = self._call("list_parts", Key=key, UploadId=upload)
        return [p["LastModified"].timestamp() for p in r.get("Parts", ())]

    def abort(self, key: str, upload: str) -> None:
        """Abort the multipart upload ``upload`` of ``key`` (its parts' bytes come back)."""
        self._abort(key, upload)

    def _abort(self, key: str, upload: str) -> None:
        try:
            self._call("abort_multipart_upload", Key=key, UploadId=upload)
        except ObjectStoreError:
            pass  # the server's lifecycle rules clean up an upload left open

    def _call(self, op: str, **kwargs: Any) -> Any:
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            EndpointConnectionError,
            NoCredentialsError,
        )

        where = f"s3://{self.name}/{kwargs.get('Key', '')}"
        try:
            return getattr(self.client, op)(Bucket=self.name, **kwargs)
        except NoCredentialsError:
            raise ConfigError(
                f"No AWS credentials found for {where}: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (and AWS_ENDPOINT_URL for an S3-compatible server), or "
                "AWS_PROFILE naming a profile in ~/.aws/credentials."
            ) from None
        except EndpointConnectionError as e:
            raise ConfigError(
                f"Cannot reach the object store for {where} ({e}): check AWS_ENDPOINT_URL "
                "(an S3-compatible server's address, e.g. http://127.0.0.1:8333) and that the "
                "server is running."
            ) from None
        except ClientError as e:
            code = str(e.response.get("Error", {}).get("Code", ""))
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code == "NoSuchBucket":
                raise ConfigError(
                    f"Bucket {self.name!r} does not exist at {self.client.meta.endpoint_url}: "
                    f"create it (aws s3 mb s3://{self.name}) or name an existing bucket."
                ) from None
            if code in ("NoSuchKey", "404", "NotFound"):
                raise _NoSuchKey(where) from None
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (
                409,
                412,
            ):
                raise _Precondition(where) from None
            if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                raise ConfigError(
                    f"The object store refused {op} on {where} ({code}): the credentials in "
                    "use (AWS_ACCESS_KEY_ID or AWS_PROFILE) may not read and write this "
                    "bucket; use credentials that may."
                ) from None
            raise ObjectStoreError(f"{op} on {where} failed: {code or status} ({e}).") from None
        except BotoCoreError as e:
            raise ObjectStoreError(f"{op} on {where} failed: {e}.") from None


class _NoSuchKey(Exception):
    pass


class _Precondition(Exception):
    pass


def bucket(url: ObjectUrl) -> Bucket:
    """The bucket of ``url``, through a client made from the AWS settings of this process."""
    return Bucket(url.bucket, _client(tuple(os.environ.get(k) for k in _SETTINGS)))


# the settings a client is made from: a change to any of them makes a new client
_SETTINGS = ("AWS_ENDPOINT_URL", "AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
             "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_CONFIG_FILE",
             "AWS_SHARED_CREDENTIALS_FILE")  # fmt: skip


@functools.lru_cache(maxsize=8)
def _client(settings: tuple[str | None, ...]) -> Any:
    endpoint, profile = settings[0], settings[1] or None
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise ConfigError(
            "Run directories on object storage need boto3: pip install 'nitro[s3]'."
        ) from None
    session = boto3.session.Session(profile_name=profile)
    config = Config(retries={"max_attempts": 5, "mode": "standard"})
    return session.client("s3", endpoint_url=endpoint, config=config)
