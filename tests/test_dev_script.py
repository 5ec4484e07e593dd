"""`./dev demo` and `./dev test`: the two commands a newcomer runs on a fresh clone.

The fast tests run the script against a stand-in environment (a `bin/python` that logs pip
and pytest calls instead of running them, and logging `nitro`, `ruff`, `mypy`, `mkdocs`), so
they check what it installs, when it skips the installs, that `./dev test` and `.ci/run`
run exactly CI's sequence, that `.ci/run` installs the Slurm cluster's system packages with
apt (once, before the tests, when a program is missing; no test installs them), and that
every test run is given transformers 4.x (`NITRO_TRANSFORMERS_4`, installed once), so
test_hf.py's check with it never skips in CI.
The slow test runs the real thing end to end in a copy of the working tree (tracked and
untracked files, not the ignored ones: what a clone of this tree would hold, uncommitted
changes included) with a fresh `.venv`, cut off from the network (`unshare -n`) where the
machine allows it, so the install must come from what pip finds locally (its configured
wheel directories and local indexes, and its cache); the demo runs once, after that install,
and a second ./dev demo (--help) shows the warm start skipping it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nitro_core.jobs import slurm_local

REPO = Path(__file__).resolve().parents[1]
_LOGGING = '#!/usr/bin/env bash\necho "{name} $*" >> "{log}"\n'
_PYTHON = """#!/usr/bin/env bash
if [ "${{1:-}}" = "-m" ] && [ "${{2:-}}" = "pip" -o "${{2:-}}" = "pytest" -o "${{2:-}}" = "mkdocs" ]; then
    echo "python $*" >> "{log}"
    [ "$2" = "pytest" ] && echo "${{NITRO_TRANSFORMERS_4-unset}}" >> "{log}.transformers-4"
    [ "$2" = "pip" ] && echo "Collecting (pip's own output, on stdout)"
    exit 0
fi
exec "{real}" "$@"
"""
TRANSFORMERS_4 = "transformers==4.57.1 huggingface-hub==0.36.0 tokenizers==0.22.1"
CI_SEQUENCE = [
    "ruff format --check .",
    "ruff check .",
    "mypy nitro_core nitro_mcp",
    "python -m pytest -q -n 2",
    "python -m pytest -q -m slow -n 2 --dist loadgroup",
    "mkdocs build --strict --quiet",
]


SYSTEM_PACKAGES = [*slurm_local.PACKAGES, *slurm_local.ACCOUNTING_PACKAGES]
SYSTEM_PROGRAMS = [*slurm_local.BINARIES, *slurm_local.ACCOUNTING_BINARIES]
APT_INSTALL = "apt-get install -y --no-install-recommends " + " ".join(SYSTEM_PACKAGES)


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without the test run's own virtual environment."""
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    here = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != here)
    return {**env, **extra}


@pytest.fixture
def standin(tmp_path):
    """A copy of ./dev, .ci/run and pyproject.toml, a stand-in environment that logs, and on
    PATH a logging apt-get and stand-ins for the Slurm cluster's programs (all there: .ci/run
    installs nothing; ``run(..., path=...)`` gives another PATH)."""
    repo, venv, log = tmp_path / "repo", tmp_path / "venv", tmp_path / "calls.log"
    system = tmp_path / "system"
    (repo / ".ci").mkdir(parents=True)
    for name in ("dev", "pyproject.toml", ".ci/run"):
        shutil.copy2(REPO / name, repo / name)
    (venv / "bin").mkdir(parents=True)
    scripts = {"python": _PYTHON.format(log=log, real=sys.executable)}
    scripts |= {n: _LOGGING.format(name=n, log=log) for n in ("nitro", "ruff", "mypy", "mkdocs")}
    for name, text in scripts.items():
        (venv / "bin" / name).write_text(text)
        (venv / "bin" / name).chmod(0o755)
    for name in ("apt-get", *SYSTEM_PROGRAMS):
        (system / name).parent.mkdir(exist_ok=True)
        (system / name).write_text(_LOGGING.format(name=name, log=log))
        (system / name).chmod(0o755)
    log.touch()

    def run(
        *args: str, path: str | None = None
    ) -> tuple[subprocess.CompletedProcess[str], list[str]]:
        before = len(log.read_text().splitlines())
        env = _clean_env(NITRO_VENV=str(venv))
        env["PATH"] = path or os.pathsep.join([str(system), env["PATH"]])
        done = subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True)
        return done, log.read_text().splitlines()[before:]

    run.repo = repo  # type: ignore[attr-defined]
    run.venv = venv  # type: ignore[attr-defined]
    run.transformers_4 = tmp_path / "calls.log.transformers-4"  # type: ignore[attr-defined]
    return run


def _install_transformers_4(venv: Path) -> str:
    pip = "python -m pip install --no-warn-conflicts"
    return f"{pip} --target {venv}/transformers-4.tmp {TRANSFORMERS_4}"


def test_demo_installs_torch_and_the_project_once_then_starts_at_once(standin):
    done, calls = standin("./dev", "demo", "--epochs", "2")
    assert done.returncode == 0, done.stderr
    assert calls == [
        "python -m pip install torch==2.13.0",
        "python -m pip install -e .",
        "nitro demo --epochs 2",
    ]
    done, calls = standin("./dev", "demo")  # warm: no pip call at all, not a word
    assert (done.returncode, calls, done.stderr) == (0, ["nitro demo"], "")


@pytest.mark.parametrize(
    ("command", "what"),
    [
        ("demo", "torch and nitro's dependencies take 2 to 5 minutes"),
        ("test", "torch, nitro and the test and docs extras take 2 to 10 minutes"),
    ],
)
def test_a_first_install_says_how_long_it_takes_and_shows_pips_progress_on_stderr(
    standin, command, what
):
    done, _ = standin("./dev", command, *(["-q"] if command == "test" else []))
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == (
        f"dev: first install: {what} here (2 CPU cores, nothing cached; longer when busy); "
        "pip's progress follows, and later runs skip it"
    )
    assert lines[1].startswith("dev: installing torch==2.13.0 and nitro")
    # pip without -q, its output on stderr: stdout stays the command's own
    assert lines[2] == "Collecting (pip's own output, on stdout)"
    assert "Collecting" not in done.stdout


def test_an_edit_to_pyproject_reinstalls(standin):
    standin("./dev", "demo")
    pyproject = standin.repo / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + "\n# a new dependency\n")
    done, calls = standin("./dev", "demo")
    assert calls[:2] == ["python -m pip install torch==2.13.0", "python -m pip install -e ."]
    assert done.stderr.startswith(  # not a first install: no estimate of one
        f"dev: pyproject.toml or the torch requirement changed: updating {standin.venv}\n"
    )


def test_dev_test_runs_what_ci_runs_and_ci_runs_dev_test(standin):
    done, calls = standin("./dev", "test")
    assert done.returncode == 0, done.stderr
    assert calls == [
        "python -m pip install torch==2.13.0",
        "python -m pip install -e .[test,docs]",
        _install_transformers_4(standin.venv),
        *CI_SEQUENCE,
    ]
    done, calls = standin("bash", ".ci/run")
    assert (done.returncode, calls) == (0, CI_SEQUENCE)  # the same, installs already done
    site = f"{standin.venv}/transformers-4"  # both suites, both times, see transformers 4.x
    assert standin.transformers_4.read_text().splitlines() == [site] * 4
    assert (standin.venv / ".nitro-dev-transformers-4").read_text() == TRANSFORMERS_4 + "\n"


def test_ci_installs_the_slurm_clusters_system_packages_before_the_tests(standin, tmp_path):
    """A program of the cluster missing from PATH (here: all but apt-get, which logs): .ci/run
    installs Debian's packages with apt first, as root, then runs ./dev test; no test does."""
    system = tmp_path / "system"
    for name in SYSTEM_PROGRAMS:
        (system / name).unlink()
    tools = tmp_path / "tools"  # what the scripts run besides those: no Slurm, wherever it is
    tools.mkdir()
    for name in ("bash", "cat", "dirname", "env", "id", "mkdir", "mv", "rm", "sed"):
        (tools / name).symlink_to(shutil.which(name) or f"/bin/{name}")
    standin("./dev", "test", "-q")  # the Python installs done: CI's own calls only
    done, calls = standin("bash", ".ci/run", path=f"{system}{os.pathsep}{tools}")
    if os.geteuid() != 0:
        assert (done.returncode, calls) == (1, [])
        assert f"ci: only root can; run: sudo apt-get install -y {' '.join(SYSTEM_PACKAGES)}" in (
            done.stderr
        )
        return
    assert done.returncode == 0, done.stderr
    assert calls == [APT_INSTALL, *CI_SEQUENCE]
    assert done.stderr.startswith(f"ci: installing {' '.join(SYSTEM_PACKAGES)} (")


def test_ci_lists_the_packages_and_programs_that_slurm_local_installs_and_needs():
    text = (REPO / ".ci" / "run").read_text()
    lists = dict(re.findall(r"^(packages|programs)=\((.*)\)$", text, re.M))
    assert lists["packages"].split() == SYSTEM_PACKAGES
    assert lists["programs"].split() == SYSTEM_PROGRAMS


def test_dev_test_passes_its_arguments_to_pytest_alone(standin):
    standin("./dev", "test", "-q")
    done, calls = standin("./dev", "test", "tests/test_readme.py", "-x")
    assert (done.returncode, calls) == (0, ["python -m pytest tests/test_readme.py -x"])
    site = f"{standin.venv}/transformers-4"
    assert standin.transformers_4.read_text().splitlines() == [site, site]


def test_transformers_4_is_installed_again_when_its_directory_or_stamp_is_gone(standin):
    standin("./dev", "test", "-q")
    site, stamp = standin.venv / "transformers-4", standin.venv / ".nitro-dev-transformers-4"
    for remove in (site.rmdir, stamp.unlink):  # an install interrupted before or after its rename
        remove()
        done, calls = standin("./dev", "test", "-q")
        assert done.returncode == 0, done.stderr
        assert calls == [_install_transformers_4(standin.venv), "python -m pytest -q"]
        assert f"dev: installing {TRANSFORMERS_4} into {site} (for test_hf.py)" in done.stderr
        assert site.is_dir() and stamp.is_file() and not Path(f"{site}.tmp").exists()


def test_the_test_installs_serve_the_demo_too(standin):
    standin("./dev", "test", "-q")
    _, calls = standin("./dev", "demo")
    assert calls == ["nitro demo"]


def test_an_environment_with_an_old_python_is_reported_not_replaced(standin, tmp_path):
    (tmp_path / "venv" / "bin" / "python").write_text("#!/usr/bin/env bash\nexit 1\n")
    done, calls = standin("./dev", "demo")
    assert done.returncode == 1 and calls == []
    assert f"dev: {tmp_path / 'venv'} holds a Python older than 3.11" in done.stderr
    assert f"remove it (rm -rf {tmp_path / 'venv'}) and run ./dev again." in done.stderr


@pytest.mark.parametrize(("args", "status"), [((), 2), (("bogus",), 2), (("--help",), 0)])
def test_usage_names_both_commands(standin, args, status):
    done, calls = standin("./dev", *args)
    assert (done.returncode, calls) == (status, [])
    assert "./dev demo [ARGS]" in done.stderr and "./dev test " in done.stderr
    if args == ("bogus",):
        assert "dev: unknown command 'bogus'" in done.stderr


def _offline() -> list[str]:
    """A prefix that runs a command without network, or [] where the machine cannot."""
    for prefix in (["unshare", "-n"], ["unshare", "-rn"]):
        try:
            if subprocess.run([*prefix, "true"], capture_output=True).returncode == 0:
                return prefix
        except FileNotFoundError:
            return []
    return []


@pytest.mark.slow
def test_the_demo_runs_end_to_end_from_a_fresh_copy_of_the_tree_offline(tmp_path):
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split("\0")  # fmt: skip
    copy = tmp_path / "nitro"
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, copy / name)
    assert not (copy / ".venv").exists()
    env = _clean_env(PIP_RETRIES="0")  # an unreachable index fails at once, pip moves on
    cmd = [*_offline(), "./dev", "demo", "--epochs", "3"]

    cold = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=1200)
    assert cold.returncode == 0, f"{cold.stdout[-3000:]}\n{cold.stderr[-3000:]}"
    assert "dev: creating" in cold.stderr and "dev: installing" in cold.stderr
    assert "dev: first install: torch and nitro's dependencies take 2 to 5 minutes" in cold.stderr
    assert re.search(r"\nSuccessfully installed .*\bnitro-", cold.stderr)  # pip's own lines
    assert "Done. The job, its run and its checkpoints stay on disk" in cold.stdout
    # the payoff: both validations followed to their end, the average beside the best
    assert "Validation, the best checkpoint against the average of the last 3:" in cold.stdout
    assert re.search(r"\n  acc +best 0\.\d{4}   average 0\.\d{4}   \([+-]0\.\d{4}\)\n", cold.stdout)
    assert list((copy / "runs" / "Classifier").glob("avg3-*.safetensors"))

    # warm: ./dev goes straight to `nitro demo` (no pip call, not a word of its own); the demo
    # itself ran above, so its --help says so without paying for a second training
    started = time.monotonic()
    warm = subprocess.run([*cmd[:-2], "--help"], cwd=copy, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    to_start = time.monotonic() - started
    assert warm.returncode == 0, f"{warm.stdout[-3000:]}\n{warm.stderr[-3000:]}"
    assert warm.stdout.startswith("usage: nitro demo ") and "--epochs EPOCHS" in warm.stdout
    assert "dev: " not in warm.stderr  # no install, no estimate
    assert to_start < 30, f"the warm ./dev demo took {to_start:.1f} s to start nitro"
