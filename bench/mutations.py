"""Mutation harness: break one guarantee at a time and check that a fast test notices.

Each mutation in ``bench/mutations.toml`` names a file, an exact snippet of it, its
replacement (a one-line change) and the few tests that should catch it. The harness
snapshots the repository once (tracked and untracked, non-ignored files: other agents may
edit the tree while it runs), then for each mutation copies the snapshot into a temporary
directory, applies the replacement there and runs ``python -m pytest -q -x -p
no:cacheprovider <tests>`` with this interpreter (``PYTHONPATH`` set to the copy, so
worker subprocesses import the mutated code too). The working tree is never touched.

First the selected tests run once on an unmutated copy: any that already fail there are
listed and left out (``--deselect``) of every mutation's run, so a kill means the mutation
broke a test that passed.

Outcomes: ``killed`` (a test failed), ``survived`` (every test passed: the guarantee is
untested), ``timeout`` (counted as killed, but look at it), ``stale`` (the snippet is not
in the file exactly once: the code moved, update the table), ``baseline`` (every selected
test already fails without the mutation, so the run says nothing) and ``error`` (pytest
could not run the selection: a usage or import error, or an interrupt).

    python bench/mutations.py              # every mutation, one at a time (~6 min, 2 cores)
    python bench/mutations.py -j 2         # two at once
    python bench/mutations.py --list       # the table
    python bench/mutations.py --check      # which rows no longer apply (runs no test)
    python bench/mutations.py --only retention-ranks-min --only 'epochs-*'
    python bench/mutations.py --only retention-ranks-min --extra-test my_test.py:tests/nitro_core/test_new.py
    python bench/mutations.py --suite --only 'journal-*'   # against the whole fast suite

With ``--suite`` each mutation runs the whole default suite (``-m "not slow"``, stopping at the
first failure) instead of the row's named tests: the kill rate then says whether any fast test
guards the row, not only the one it names.

Exit status: 1 when a required mutation (one issue 8 names) is not killed (it survived,
or is stale, baseline or error), 130 when interrupted, else 0.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TABLE = Path(__file__).resolve().with_suffix(".toml")
SKIP_DIRS = {".git", ".venv", "runs", ".nitro", "__pycache__", ".pytest_cache", ".hypothesis"}
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts="]
SUITE = ("-m", "not slow")  # --suite: the default suite, as the README runs it


@dataclass(frozen=True)
class Mutation:
    """One row of the table."""

    name: str
    file: str  # relative to the repository root
    old: str  # an exact snippet, found exactly once in ``file``
    new: str  # what replaces it
    why: str  # the guarantee it breaks
    tests: tuple[str, ...]  # pytest arguments: node ids, files, "-k", "expression"
    required: bool = False  # named by the issue: must be killed


def load_table(path: Path = TABLE) -> list[Mutation]:
    with open(path, "rb") as f:
        rows = tomllib.load(f)["mutation"]
    return [Mutation(**{**row, "tests": tuple(row["tests"])}) for row in rows]


@dataclass
class Outcome:
    mutation: Mutation
    status: str  # killed, survived, timeout, stale, baseline, error
    seconds: float
    detail: str = ""


# -- copying the repository -------------------------------------------------------------------
def repo_files(repo: Path) -> list[str]:
    """Tracked and untracked non-ignored files (git), or a walk when git is unavailable."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=repo,
            capture_output=True,
            check=True,
        ).stdout
        names = sorted({n for n in out.decode().split("\0") if n})
    except (OSError, subprocess.CalledProcessError):
        names = [
            str(p.relative_to(repo))
            for p in repo.rglob("*")
            if p.is_file() and not SKIP_DIRS & set(p.relative_to(repo).parts)
        ]
    return [n for n in names if (repo / n).is_file()]  # a deleted tracked file is skipped


def copy_repo(repo: Path, files: list[str], into: Path) -> None:
    for name in files:
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, target)


def find(mutation: Mutation, root: Path) -> str | None:
    """Why ``mutation`` does not apply under ``root`` (None when its snippet is there once)."""
    path = root / mutation.file
    if not path.is_file():
        return f"{mutation.file} does not exist"
    count = path.read_text().count(mutation.old)
    if count != 1:
        return f"snippet found {count} times in {mutation.file} (needs exactly 1)"
    if mutation.old == mutation.new:
        return "old and new are the same"
    return None


def apply(mutation: Mutation, root: Path) -> str | None:
    """Apply ``mutation`` under ``root``; returns why it is stale, or None once applied."""
    stale = find(mutation, root)
    if stale is None:
        path = root / mutation.file
        path.write_text(path.read_text().replace(mutation.old, mutation.new))
    return stale


# -- running the tests ------------------------------------------------------------------------
_PLUGIN = """
import os

def pytest_runtest_logreport(report):
    if report.failed:
        with open(os.environ["NITRO_MUTATION_FAILED"], "a") as f:
            f.write(report.nodeid + "\\n")

def pytest_collectreport(report):
    if report.failed:
        with open(os.environ["NITRO_MUTATION_FAILED"], "a") as f:
            f.write(report.nodeid + "\\n")
"""
_LIVE: set[subprocess.Popen] = set()
_STOP = threading.Event()


def run_pytest(
    root: Path, args: list[str], timeout: float, record: Path | None = None
) -> tuple[str, str, float]:
    """(passed | failed | timeout | error | empty, the line that says why, seconds). With
    ``record``, every failing test id is appended to that file (and -x is not used)."""
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTEST_ADDOPTS", None)
    command = [*PYTEST, "-x", *args]
    if record is not None:
        (record.parent / "_nitro_mutation_plugin.py").write_text(_PLUGIN)
        env["PYTHONPATH"] += os.pathsep + str(record.parent)
        env["NITRO_MUTATION_FAILED"] = str(record)
        command = [*PYTEST, "-p", "_nitro_mutation_plugin", *args]
    started = time.monotonic()
    with subprocess.Popen(
        command,
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: a timeout ends its workers too
    ) as proc:
        _LIVE.add(proc)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _end(proc)
            proc.communicate()
            return "timeout", f"no result after {timeout:.0f} s", time.monotonic() - started
        finally:
            _LIVE.discard(proc)
    seconds = time.monotonic() - started
    if _STOP.is_set():
        return "error", "interrupted", seconds
    code = {0: "passed", 1: "failed", 5: "empty"}.get(proc.returncode, "error")
    why = _last_line(out) if code in ("passed", "empty") else _why(out)
    return code, why if code != "error" else f"pytest exit {proc.returncode}: {why}", seconds


def _end(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _why(out: str) -> str:
    for line in out.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line[:200]
    return _last_line(out)


def _last_line(out: str) -> str:
    lines = [line for line in out.splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def check_isolation(root: Path) -> None:
    """The copy, not the working tree, must be what the tests import."""
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run(
        [sys.executable, "-c", "import nitro_core, nitro_mcp; print(nitro_core.__file__)"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    where = out.stdout.strip()
    if out.returncode != 0 or not Path(where).resolve().is_relative_to(root.resolve()):
        sys.exit(f"The copy does not import its own nitro_core ({where or out.stderr.strip()}).")


def run_one(
    mutation: Mutation, snapshot: Path, files: list[str], timeout: float, broken: list[str]
) -> Outcome:
    """Apply one mutation in a fresh copy and run its tests, leaving out those that already
    fail without it (``broken``)."""
    if _STOP.is_set():
        return Outcome(mutation, "error", 0.0, "interrupted")
    with tempfile.TemporaryDirectory(prefix="nitro-mut-") as tmp:
        root = Path(tmp) / "repo"
        copy_repo(snapshot, files, root)
        stale = apply(mutation, root)
        if stale is not None:
            return Outcome(mutation, "stale", 0.0, stale)
        deselect = [f"--deselect={nodeid}" for nodeid in broken]
        result, why, seconds = run_pytest(root, [*mutation.tests, *deselect], timeout)
    if result == "empty":
        return Outcome(mutation, "baseline", seconds, "every selected test fails without it")
    status = {"passed": "survived", "failed": "killed", "timeout": "timeout", "error": "error"}
    return Outcome(mutation, status[result], seconds, why)


def run_baseline(
    selected: list[Mutation], snapshot: Path, files: list[str], timeout: float
) -> list[str]:
    """The ids of the selected tests that fail on the unmutated copy (run once, together)."""
    args = list(dict.fromkeys(arg for m in selected for arg in m.tests))
    with tempfile.TemporaryDirectory(prefix="nitro-base-") as tmp:
        root = Path(tmp) / "repo"
        copy_repo(snapshot, files, root)
        record = Path(tmp) / "plugin" / "failed.txt"
        record.parent.mkdir()
        record.touch()
        result, why, seconds = run_pytest(root, args, timeout * 4, record)
        broken = [n for n in dict.fromkeys(record.read_text().splitlines()) if n]
    print(f"baseline: {result} in {seconds:.0f} s ({why})", flush=True)
    if result in ("timeout", "error"):
        sys.exit(f"The unmutated tests did not run to the end ({why}); fix that first.")
    for nodeid in broken:
        print(f"  fails without any mutation, left out: {nodeid}", flush=True)
    return broken


# -- the command line ---------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], help="name or glob (repeatable)")
    parser.add_argument("--list", action="store_true", help="print the table and exit")
    parser.add_argument(
        "--check", action="store_true", help="only report stale rows (no tests run)"
    )
    parser.add_argument("-j", type=int, default=1, help="mutations run at once (default 1)")
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds per pytest run (180; 900 with --suite)"
    )
    parser.add_argument(
        "--extra-test",
        action="append",
        default=[],
        type=_extra_test,
        metavar="FILE[:DEST]",
        help="copy FILE into the copies (at DEST, default tests/<name>) and add it to every "
        "selected mutation's tests: try a new test against the table before adding it",
    )
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the unmutated run of the selected tests"
    )
    parser.add_argument(
        "--suite",
        action="store_true",
        help="run the whole default suite (-m 'not slow') for each mutation, not its named tests",
    )
    args = parser.parse_args(argv)

    mutations = load_table()
    names = [m.name for m in mutations]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        sys.exit(f"Duplicate mutation names: {sorted(duplicates)}")
    selected = [
        m for m in mutations if not args.only or any(fnmatch.fnmatch(m.name, p) for p in args.only)
    ]
    if not selected:
        sys.exit(f"No mutation matches --only {args.only}; --list shows the names.")
    if args.list:
        for m in selected:
            flag = "required" if m.required else "        "
            print(f"{m.name:34} {flag}  {m.file}: {m.why}\n{'':46}tests: {' '.join(m.tests)}")
        return 0

    if args.check:
        stale = [(m, why) for m in selected if (why := find(m, REPO)) is not None]
        stale += [
            (m, f"{test} does not exist")
            for m in selected
            for test in m.tests
            if not test.startswith("-") and not (REPO / test.split("::")[0]).exists()
        ]
        for m, why in stale:
            print(f"STALE     {m.name:34} {why}")
        print(f"{len(selected) - len(stale)}/{len(selected)} rows apply")
        return 1 if stale else 0

    started = time.monotonic()
    signal.signal(signal.SIGTERM, _interrupt)
    outcomes: list[Outcome] = []
    pool = ThreadPoolExecutor(max_workers=max(1, args.j))
    holder = tempfile.TemporaryDirectory(prefix="nitro-snap-")
    try:
        # one snapshot of the tree for the whole run: others may edit it meanwhile
        snapshot, files = take_snapshot(Path(holder.name) / "repo", args.extra_test)
        check_isolation(snapshot)
        if args.suite:
            selected = [replace(m, tests=SUITE) for m in selected]
        if args.timeout is None:
            args.timeout = 900.0 if args.suite else 180.0
        if extra := [dest for _, dest in args.extra_test]:
            selected = [replace(m, tests=(*m.tests, *extra)) for m in selected]
        broken = [] if args.no_baseline else run_baseline(selected, snapshot, files, args.timeout)
        futures = [pool.submit(run_one, m, snapshot, files, args.timeout, broken) for m in selected]
        for future in futures:
            o = future.result()
            outcomes.append(o)
            tag = "required" if o.mutation.required else ""
            print(
                f"{o.status.upper():9} {o.mutation.name:34} {tag:8} {o.seconds:6.1f}s  {o.detail}",
                flush=True,
            )
    except KeyboardInterrupt:
        _STOP.set()
        for proc in list(_LIVE):
            _end(proc)
        print("interrupted: the mutations run so far follow", flush=True)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        holder.cleanup()
    code = report(outcomes, time.monotonic() - started)
    return 130 if _STOP.is_set() else code


def take_snapshot(into: Path, extra: list[tuple[Path, str]]) -> tuple[Path, list[str]]:
    """Copy the working tree (and any extra test files) once; returns it and its files."""
    files = repo_files(REPO)
    copy_repo(REPO, files, into)
    for source, dest in extra:
        (into / dest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, into / dest)
        files.append(dest)
    return into, files


def _extra_test(text: str) -> tuple[Path, str]:
    source, _, dest = text.partition(":")
    path = Path(source).resolve()
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{source} is not a file")
    return path, dest or f"tests/{path.name}"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def report(outcomes: list[Outcome], seconds: float) -> int:
    counted = [o for o in outcomes if o.status in ("killed", "timeout", "survived")]
    killed = [o for o in counted if o.status != "survived"]
    print(f"\n{len(outcomes)} mutations in {seconds:.0f} s:", end=" ")
    print(", ".join(f"{s} {sum(o.status == s for o in outcomes)}" for s in _STATUSES))
    for label, group in (("required", True), ("broader", False)):
        mine = [o for o in counted if o.mutation.required == group]
        dead = [o for o in mine if o.status != "survived"]
        if mine:
            print(f"  {label}: {len(dead)}/{len(mine)} killed ({100 * len(dead) / len(mine):.0f}%)")
    if counted:
        print(
            f"  kill rate: {len(killed)}/{len(counted)} ({100 * len(killed) / len(counted):.0f}%)"
        )
    for o in outcomes:
        if o.status in ("survived", "stale", "baseline", "error"):
            print(f"  {o.status}: {o.mutation.name} ({o.mutation.file}): {o.mutation.why}")
    failing = [
        o
        for o in outcomes
        if o.mutation.required and o.status in ("survived", "stale", "baseline", "error")
    ]
    return 1 if failing else 0


_STATUSES = ("killed", "timeout", "survived", "stale", "baseline", "error")


if __name__ == "__main__":
    sys.exit(main())
