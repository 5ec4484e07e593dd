"""The wait at interpreter exit for gloo's threads (nitro_core.training.distributed): it
returns once the named threads sleep and stay asleep, and gives up at its limit while one
keeps running. Real threads, named through /proc as gloo names its own."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from nitro_core.training.distributed import GLOO_THREADS, wait_threads_idle

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/task")


def _named(name: str, target) -> threading.Thread:
    ready = threading.Event()

    def run() -> None:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
            f.write(name)
        ready.set()
        target()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    ready.wait()
    return t


def test_it_returns_once_the_named_threads_sleep_and_not_while_one_runs() -> None:
    stop = threading.Event()
    sleeping = _named("nitro-test-idle", stop.wait)
    spinning = _named("nitro-test-busy", lambda: _spin_until(stop))
    try:
        assert wait_threads_idle(("nitro-test-idle",), limit=30.0) is True
        started = time.monotonic()
        assert wait_threads_idle(("nitro-test-idle", "nitro-test-busy"), limit=0.3) is False
        assert time.monotonic() - started >= 0.3  # it waited its limit out, then gave up
    finally:
        stop.set()
        sleeping.join()
        spinning.join()


def test_it_returns_at_once_when_no_thread_has_the_names() -> None:
    started = time.monotonic()
    assert wait_threads_idle(("nitro-no-such-thread",), limit=30.0) is True
    assert time.monotonic() - started < 30.0
    assert set(GLOO_THREADS) == {"pt_gloo_runloop", "gloo_tcp_loop"}


def _spin_until(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(1000))  # runs (and takes the GIL back) without sleeping


def test_the_exit_wait_is_registered_for_a_group_the_script_made_too(tmp_path, monkeypatch):
    """A torchrun script that makes its own group (then Nitro joins it) keeps gloo's threads
    in its DDP or FSDP modules as well: the exit wait is registered for it too (without it a
    2-rank CI run aborted at exit: 'terminate called without an active exception')."""
    import atexit

    import torch
    import torch.distributed as dist

    from nitro_core.training import distributed

    registered = []
    monkeypatch.setattr(atexit, "register", lambda f, *a, **k: registered.append(f))
    monkeypatch.setattr(atexit, "unregister", lambda f: None)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)  # fmt: skip
    try:
        d, _ = distributed.join("ddp", torch.device("cpu"), requested=False)
        assert d.owned is False  # the script's group: the script destroys it
        assert registered == [distributed._destroy_at_exit]
    finally:
        dist.destroy_process_group()
