"""Records on object storage against plain S3 transfers of the same bytes, on a SeaweedFS
server the benchmark starts on 127.0.0.1 (tests/s3_server.py) and stops.

- write: ``object_run.publish`` of a ~256 MB record (a multipart upload completed with
  ``If-None-Match: *``, then the manifest's conditional replace) against boto3's
  ``upload_file`` of the same file (s3transfer's concurrent multipart, no condition);
- read: ``object_run.fetch`` of it (concurrent ranged GETs) against boto3's
  ``download_file``;
- both also against s3fs's ``put`` and ``cat_file`` (fsspec), where s3fs is installed;
- the manifest commit (read, change, conditional replace) with 100 and 10,000 entries.

Targets (issue 22): write and read within 1.2x the plain transfer.

Run from the repository root:  python bench/object_storage.py [--size-mb 256] [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nitro_core.store import object_run, objects, recordio  # noqa: E402
from nitro_core.store.manifest import ManifestEntry, Point  # noqa: E402
from tests.s3_server import seaweedfs, settings  # noqa: E402

TARGET = 1.2


def timed(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def entry(i: int, file: str, size: int, digest: str) -> ManifestEntry:
    return ManifestEntry(
        file=file, epoch=i + 1, step=i + 1, score=None, metric=None, mode=None, run="bench",
        stop_reason=None, parent=None, keep=None,
        written="2026-12-07T00:00:00.000Z", bytes=size, digest=digest,
    )  # fmt: skip


def _next_point(state) -> None:
    """One commit's change: the next point of the run (the manifest grows by one point)."""
    mine = state.points.get("bench", [])
    state.add_point("bench", Point(epoch=1, step=(mine[-1].step if mine else 0) + 1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, default=256)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    import boto3

    with seaweedfs() as endpoint, tempfile.TemporaryDirectory() as tmp:
        os.environ.update(settings(endpoint))
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="bench")
        n = args.size_mb * 1024 * 1024 // 4 // 4
        tensors = {f"params/w{i}": torch.randn(n) for i in range(4)}
        record = Path(tmp, "epoch-0001-step-1.safetensors")
        size, digest = recordio.write_record(record, tensors, {"step": 1})
        run = objects.parse("s3://bench/runs/a")
        down = Path(tmp, "down")

        def nitro_write() -> None:
            e = entry(0, f"r-{uuid.uuid4().hex}.safetensors", size, digest)
            object_run.publish(run, record, e, None)

        def plain_write() -> None:
            client.upload_file(str(record), "bench", f"plain/{uuid.uuid4().hex}")

        nitro_write()
        first = object_run.read_manifest(run)[0]
        listed = run.child(first.file)
        client.upload_file(str(record), "bench", "plain/read")

        def nitro_read() -> None:
            object_run.fetch(listed, down).unlink()

        def plain_read() -> None:
            client.download_file("bench", "plain/read", str(Path(tmp, "plain-read")))

        fs = _s3fs(endpoint)  # the baseline, where s3fs is installed

        def fs_write() -> None:
            fs.put(str(record), f"bench/fsspec/{uuid.uuid4().hex}")

        def fs_read() -> None:
            fs.cat_file("bench/plain/read")

        rows = []
        for what, ours, theirs, fsspec in (("write", nitro_write, plain_write, fs_write),
                                           ("read", nitro_read, plain_read, fs_read)):  # fmt: skip
            ours(), theirs()  # warm
            a, b = timed(ours, args.reps), timed(theirs, args.reps)
            rows.append((what, a, b))
            mb = size / 1e6
            print(f"{what:5}  nitro {a:.3f} s ({mb / a:.0f} MB/s)  boto3 {b:.3f} s "
                  f"({mb / b:.0f} MB/s)  ratio {a / b:.2f}x  (target <= {TARGET}x)")  # fmt: skip
            if fs is not None:
                fsspec()  # warm
                c = timed(fsspec, args.reps)
                rows.append((what, a, c))
                print(f"{what:5}  nitro {a:.3f} s  s3fs {c:.3f} s ({mb / c:.0f} MB/s)  "
                      f"ratio {a / c:.2f}x  (target <= {TARGET}x)")  # fmt: skip
        for count in (100, 10_000):
            url = objects.parse(f"s3://bench/manifests/m{count}")
            entries = [entry(i, f"e{i}.safetensors", 1, digest) for i in range(count)]

            def fill(state, entries=entries):
                state.entries.extend(entries)

            object_run.commit(url, fill)
            t = timed(lambda url=url: object_run.commit(url, _next_point), args.reps)
            body = client.head_object(Bucket="bench", Key=f"manifests/m{count}/manifest.json")
            print(f"manifest commit, {count:>6} entries ({body['ContentLength'] / 1e6:.2f} MB): "
                  f"{t * 1000:.1f} ms")  # fmt: skip
        ok = all(a / b <= TARGET for _, a, b in rows)
        print("targets met" if ok else "a target missed")


def _s3fs(endpoint: str):  # noqa: ANN202 (an s3fs.S3FileSystem, or None)
    """s3fs on the server, or None (not installed: pip install s3fs; it pins botocore to
    aiobotocore's range, so it is no dependency of Nitro)."""
    try:
        import s3fs
    except ImportError:
        print("s3fs not installed: its put/cat rows are left out (pip install s3fs)")
        return None
    return s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}, use_listings_cache=False)


if __name__ == "__main__":
    main()
