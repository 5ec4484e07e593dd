"""A real Slurm cluster of N nodes on 127.0.0.1, for tests and for trying the Slurm executor
on one machine:
``python -m nitro_core.jobs.slurm_local up|down|status [--nodes N] [--dir D] [--accounting]``.

It runs Debian's own daemons (installing ``slurmctld slurmd slurm-client munge`` with apt
when they are missing and this is root): one ``munged`` and one ``slurmctld`` on private
sockets and ports, and one ``slurmd -N n<i>`` per node, each on its own port (Slurm's
several-daemons-per-host mode). With ``--accounting`` (``slurmdbd mariadb-server`` installed
the same way), a ``mariadbd`` on a private socket and port and a ``slurmdbd`` keep the jobs,
so ``sacct`` answers; without, it has no states and the executor falls back to ``squeue``.
Everything it writes lives under its directory (default
``$NITRO_SLURM_DIR``, else ``/tmp/nitro-slurm``): ``slurm.conf``, the munge key, the
daemons' state, spool, logs, the database and ``daemons.json`` (each daemon's pid and process start time).
``down`` stops only those daemons, by pid, after checking each still is the process it
started. The cluster's clients find it through ``SLURM_CONF=<dir>/slurm.conf`` (``up``
prints the line to export; :func:`environment` gives it to a process).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nitro_core.jobs.files import alive, process_start

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "sinfo")
ACCOUNTING_PACKAGES = ("slurmdbd", "mariadb-server")  # with --accounting: sacct's states
ACCOUNTING_BINARIES = ("slurmdbd", "mariadbd", "mariadb-install-db", "mariadb", "sacctmgr")
PARTITION = "debug"
READY_S = 60.0


@dataclass(frozen=True)
class Cluster:
    """A running local cluster: its directory, nodes and partition."""

    directory: Path
    nodes: int
    partition: str = PARTITION
    accounting: bool = False  # slurmdbd (on its own MariaDB) keeps the jobs for sacct

    @property
    def conf(self) -> Path:
        return self.directory / "slurm.conf"

    def environment(self) -> dict[str, str]:
        """The environment a Slurm client needs to reach this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}


def default_dir() -> Path:
    return Path(os.environ.get("NITRO_SLURM_DIR", "/tmp/nitro-slurm"))


def missing_binaries(accounting: bool = False) -> list[str]:
    """The programs the cluster needs that are on neither ``PATH`` nor ``/usr/sbin``."""
    sbin = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin"
    wanted = BINARIES + (ACCOUNTING_BINARIES if accounting else ())
    return [b for b in wanted if shutil.which(b, path=sbin) is None]


class NotInstalled(RuntimeError):
    """Slurm (or, with accounting, slurmdbd and MariaDB) is missing and this is not root."""


def install(accounting: bool = False) -> None:
    """Install Debian's Slurm and munge packages (with ``accounting``, slurmdbd and MariaDB
    too) when any of their programs is missing; only root can."""
    missing = missing_binaries(accounting)
    if not missing:
        return
    packages = PACKAGES + (ACCOUNTING_PACKAGES if accounting else ())
    if os.geteuid() != 0:
        raise NotInstalled(
            f"Slurm is not installed ({', '.join(missing)} missing) and this is not "
            f"root; run: sudo apt-get install -y {' '.join(packages)}"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    apt = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
    if subprocess.run(apt, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, check=True)
        subprocess.run(apt, env=env, capture_output=True, check=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sbin(name: str) -> str:
    found = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    assert found is not None, name  # install() ran
    return found


def _config(directory: Path, nodes: int, cpus: int, dbd_port: int | None = None) -> str:
    d = directory
    ctl, *ports = (_free_port() for _ in range(nodes + 1))
    storage = (
        ["AccountingStorageType=accounting_storage/none"]
        if dbd_port is None
        else [
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=localhost",
            f"AccountingStoragePort={dbd_port}",
            f"AccountingStoragePass={d / 'munge' / 'munge.socket'}",
        ]
    )  # fmt: skip  (slurmdbd's munge socket is AccountingStoragePass, not AuthInfo)
    lines = [
        "ClusterName=nitro",
        "SlurmctldHost=localhost(127.0.0.1)",
        f"SlurmctldPort={ctl}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={d / 'munge' / 'munge.socket'}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={d / 'state'}",
        f"SlurmdSpoolDir={d / 'spool'}/%n",
        f"SlurmctldPidFile={d / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={d / 'run'}/slurmd-%n.pid",
        f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={d / 'log'}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SwitchType=switch/none",
        "MpiDefault=none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "JobAcctGatherType=jobacct_gather/none",
        *storage,
        "JobCompType=jobcomp/none",
        "MinJobAge=300",
        "KillWait=10",
        "InactiveLimit=0",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=30",
    ]
    names = [f"n{i + 1}" for i in range(nodes)]
    for name, port in zip(names, ports, strict=True):
        lines.append(
            f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} "
            f"CPUs={cpus} RealMemory=1000 State=UNKNOWN"
        )
    lines.append(
        f"PartitionName={PARTITION} Nodes={','.join(names)} Default=YES MaxTime=INFINITE "
        "State=UP OverSubscribe=FORCE:4"
    )
    return "\n".join(lines) + "\n"


def _spawn(argv: list[str], log: Path, env: dict[str, str] | None = None) -> dict[str, object]:
    with open(log, "ab") as out:
        child = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, env=env,
        )  # fmt: skip
    time.sleep(0.05)
    return {"argv": argv, "pid": child.pid, "start": process_start(child.pid)}


def _daemons_file(directory: Path) -> Path:
    return directory / "daemons.json"


def _running(daemon: dict[str, object]) -> bool:
    """Whether the daemon is still the process ``up`` started (a zombie is not: in a process
    that called ``up`` itself, as the tests do, an exited daemon stays one until reaped)."""
    pid, start = daemon["pid"], daemon["start"]
    assert isinstance(pid, int) and isinstance(start, str)
    return alive(pid, start) and process_start(pid) == start


def _reap(pid: int) -> None:
    """Collect the exit of a daemon this process started (no zombie left); another
    process's child is not ours to collect."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def up(
    nodes: int = 2,
    directory: Path | None = None,
    cpus: int | None = None,
    accounting: bool = False,
) -> Cluster:
    """Start the cluster (installing Slurm when root and missing); returns once every node
    is idle in ``sinfo``. With ``accounting``, a MariaDB server and ``slurmdbd`` of its own
    keep the jobs, so ``sacct`` answers. A cluster already up in ``directory`` with these
    nodes and accounting is returned as it is; one with others is stopped first. When a
    daemon does not come up, every daemon started so far is stopped before the error."""
    directory = (directory or default_dir()).resolve()
    cluster = Cluster(directory, nodes, accounting=accounting)
    if _daemons_file(directory).exists():
        daemons = json.loads(_daemons_file(directory).read_text())
        if daemons and all(_running(d) for d in daemons) and _same(cluster):
            _wait_idle(cluster, daemons)
            return cluster
        down(directory)
    install(accounting)
    try:
        _start(cluster, cpus or max(os.cpu_count() or 1, 2))
    except BaseException:
        down(directory)
        raise
    return cluster


def _same(cluster: Cluster) -> bool:
    """Whether the cluster's slurm.conf has its number of nodes and its accounting."""
    conf = cluster.conf.read_text() if cluster.conf.exists() else ""
    nodes = sum(1 for line in conf.splitlines() if line.startswith("NodeName="))
    return nodes == cluster.nodes and ("accounting_storage/slurmdbd" in conf) == cluster.accounting


def _start(cluster: Cluster, cpus: int) -> None:
    """Write the config and start the daemons in order: munged, MariaDB and slurmdbd (with
    accounting), slurmctld, one slurmd per node; ``daemons.json`` lists each as it starts."""
    directory = cluster.directory
    for sub in ("munge", "state", "spool", "run", "log"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(directory / "munge", 0o700)
    key = directory / "munge" / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
    dbd_port = _free_port() if cluster.accounting else None
    cluster.conf.write_text(_config(directory, cluster.nodes, cpus, dbd_port))
    env_conf = ["-f", str(cluster.conf)]
    munge = directory / "munge"
    daemons: list[dict[str, object]] = []

    def started(daemon: dict[str, object]) -> None:
        daemons.append(daemon)
        _daemons_file(directory).write_text(json.dumps(daemons))

    started(
        _spawn(
            [
                _sbin("munged"),
                "-F",
                "--force",
                f"--socket={munge / 'munge.socket'}",
                f"--key-file={key}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--log-file={directory / 'log' / 'munged.log'}",
                f"--seed-file={munge / 'seed'}",
            ],
            directory / "log" / "munged.out",
        )  # fmt: skip
    )
    _wait_for(lambda: (munge / "munge.socket").exists(), "munged's socket", directory, daemons)
    if dbd_port is not None:
        _start_accounting(cluster, dbd_port, started, daemons)
    started(
        _spawn([_sbin("slurmctld"), "-D", "-i", *env_conf], directory / "log" / "slurmctld.out")
    )
    for i in range(cluster.nodes):
        name = f"n{i + 1}"
        started(
            _spawn(
                [_sbin("slurmd"), "-D", "-N", name, *env_conf],
                directory / "log" / f"slurmd-{name}.out",
            )
        )
    _wait_idle(cluster, daemons)


def _start_accounting(
    cluster: Cluster,
    dbd_port: int,
    started: Callable[[dict[str, object]], None],
    daemons: list[dict[str, object]],
) -> None:
    """A MariaDB server on a private socket and port, a database user for slurmdbd, and
    slurmdbd itself (its config beside slurm.conf, where it looks); the cluster registered.
    ``started`` records each daemon as it starts, so ``down`` stops it whatever comes next."""
    d = cluster.directory
    db = d / "db"
    if not (db / "mysql").exists():
        shutil.rmtree(db, ignore_errors=True)  # what an interrupted first start left
        subprocess.run(
            [_sbin("mariadb-install-db"), "--no-defaults", f"--datadir={db}", "--user=root",
             "--auth-root-authentication-method=normal", "--skip-test-db"],
            capture_output=True, check=True, timeout=300,
        )  # fmt: skip
    sock, db_port = d / "run" / "mysqld.sock", _free_port()
    started(
        _spawn(
            [
                _sbin("mariadbd"),
                "--no-defaults",
                f"--datadir={db}",
                f"--socket={sock}",
                f"--port={db_port}",
                "--bind-address=127.0.0.1",
                "--user=root",
                f"--pid-file={d / 'run' / 'mysqld.pid'}",
                f"--log-error={d / 'log' / 'mysqld.log'}",
                "--innodb-buffer-pool-size=32M",
                "--skip-log-bin",
            ],
            d / "log" / "mysqld.out",
        )  # fmt: skip
    )
    grant = ("CREATE DATABASE IF NOT EXISTS slurm_acct_db; "
             "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'nitro'; "
             "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';")  # fmt: skip
    mariadb = [_sbin("mariadb"), "--no-defaults", f"--socket={sock}", "-uroot", "-e", grant]
    _wait_for(lambda: _succeeds(mariadb), "MariaDB answering", d, daemons)
    conf = d / "slurmdbd.conf"  # slurmdbd reads it from slurm.conf's directory
    conf.write_text("\n".join([
        "AuthType=auth/munge", f"AuthInfo=socket={d / 'munge' / 'munge.socket'}",
        "DbdHost=localhost", "DbdAddr=127.0.0.1", f"DbdPort={dbd_port}", "SlurmUser=root",
        "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1",
        f"StoragePort={db_port}", "StorageUser=slurm", "StoragePass=nitro",
        "StorageLoc=slurm_acct_db", f"PidFile={d / 'run' / 'slurmdbd.pid'}",
        f"LogFile={d / 'log' / 'slurmdbd.log'}", "",
    ]))  # fmt: skip
    conf.chmod(0o600)
    started(_spawn([_sbin("slurmdbd"), "-D"], d / "log" / "slurmdbd.out", cluster.environment()))
    _wait_for(lambda: _listening(dbd_port), "slurmdbd listening", d, daemons)
    add = ["sacctmgr", "-i", "add", "cluster", "nitro"]  # on a database kept from before: there
    known = ["sacctmgr", "-n", "-P", "list", "cluster", "format=Cluster"]
    _wait_for(
        lambda: _succeeds(add, cluster) and "nitro" in _output(known, cluster).split(),
        "the cluster registered with slurmdbd", d, daemons,
    )  # fmt: skip


def _succeeds(argv: list[str], cluster: Cluster | None = None) -> bool:
    env = cluster.environment() if cluster is not None else None
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0 or "already exists" in done.stdout + done.stderr


def _output(argv: list[str], cluster: Cluster) -> str:
    try:
        done = subprocess.run(
            argv, env=cluster.environment(), capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        return ""
    return done.stdout if done.returncode == 0 else ""


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait_for(
    ready: Callable[[], bool],
    what: str,
    directory: Path,
    daemons: list[dict[str, object]] | None = None,
    limit: float = READY_S,
) -> None:
    """Poll ``ready`` until it holds; raise when ``limit`` passes or one of ``daemons``
    exits meanwhile (naming it: its log says why)."""
    deadline = time.monotonic() + limit
    while not ready():
        dead = next((d for d in daemons or [] if not _running(d)), None)
        if dead is not None:
            raise RuntimeError(
                f"The local Slurm cluster's {Path(str(_argv(dead)[0])).name} (pid {dead['pid']}) "
                f"exited while waiting for {what}; its logs are in {str(directory / 'log')!r}."
            )
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"The local Slurm cluster did not get {what} within {limit:.0f} s; its logs are "
                f"in {str(directory / 'log')!r}."
            )
        time.sleep(0.2)


def _argv(daemon: dict[str, object]) -> list[str]:
    argv = daemon["argv"]
    assert isinstance(argv, list)
    return argv


def node_states(cluster: Cluster) -> dict[str, str]:
    """Each node's state as ``sinfo`` says (empty when slurmctld does not answer)."""
    done = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %T"], env=cluster.environment(), capture_output=True,
        text=True, timeout=20,
    )  # fmt: skip
    if done.returncode != 0:
        return {}
    return dict(line.split(None, 1) for line in done.stdout.split("\n") if line.strip())


def _wait_idle(cluster: Cluster, daemons: list[dict[str, object]]) -> None:
    def idle() -> bool:
        states = node_states(cluster)
        return len(states) == cluster.nodes and all(
            s.rstrip("*~#") in ("idle", "mixed", "allocated") for s in states.values()
        )

    _wait_for(idle, f"{cluster.nodes} idle nodes", cluster.directory, daemons)


def down(directory: Path | None = None) -> list[int]:
    """Stop the daemons ``up`` started in ``directory`` (only those, by pid, each checked to
    be the same process); returns the pids stopped."""
    directory = (directory or default_dir()).resolve()
    path = _daemons_file(directory)
    if not path.exists():
        return []
    stopped = []
    for daemon in reversed(json.loads(path.read_text())):  # the nodes first, munged last
        pid = int(str(daemon["pid"]))
        if _running(daemon):
            for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
                os.kill(pid, sig)
                deadline = time.monotonic() + wait
                while _running(daemon) and time.monotonic() < deadline:
                    time.sleep(0.1)
                if not _running(daemon):
                    break
            stopped.append(pid)
        _reap(pid)
    path.unlink()
    return stopped


def status(directory: Path | None = None) -> dict[str, object]:
    """Which of the daemons are running, and the nodes' states."""
    directory = (directory or default_dir()).resolve()
    path = _daemons_file(directory)
    daemons = json.loads(path.read_text()) if path.exists() else []
    running = [d for d in daemons if _running(d)]
    nodes = sum(1 for d in daemons if Path(str(d["argv"][0])).name == "slurmd")
    states = node_states(Cluster(directory, nodes)) if running else {}
    return {
        "directory": str(directory),
        "daemons": [
            {"name": Path(str(d["argv"][0])).name, "pid": d["pid"], "running": d in running}
            for d in daemons
        ],  # fmt: skip
        "nodes": states,
        "SLURM_CONF": str(directory / "slurm.conf"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nitro_core.jobs.slurm_local")
    parser.add_argument("action", choices=("up", "down", "status"))
    parser.add_argument("--nodes", type=int, default=2, help="nodes of the cluster (up)")
    parser.add_argument("--dir", type=Path, default=None, help="its directory")
    parser.add_argument("--accounting", action="store_true",
                        help="also slurmdbd on a MariaDB of its own, so sacct answers (up)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.action == "up":
        cluster = up(args.nodes, args.dir, accounting=args.accounting)
        print(f"export SLURM_CONF={cluster.conf}")
    elif args.action == "down":
        print(f"stopped {len(down(args.dir))} daemons")
    else:
        print(json.dumps(status(args.dir), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
