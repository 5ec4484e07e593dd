"""--experiment-module: a dotted module or a .py file inside the root, listed once, re-imported
when edited, and never fatal to the server when it fails to import."""

from __future__ import annotations

import os
import sys
import uuid

import anyio
import pytest
from mcp import Client, StdioServerParameters

from nitro_core.examples import EXAMPLES
from nitro_mcp.server import build_server

from .conftest import call, wait_done

TINY = '''from nitro_core.examples import Regression


class Tiny(Regression):
    """A small regression from the operator's own file."""

    samples: int = 64
'''
FIX = (
    "Fix the file and call again: it is imported afresh when it changes (nitro_experiments "
    "shows the traceback)."
)


def _fields(listing: dict, name: str) -> list[str]:
    (exp,) = [e for e in listing["experiments"] if e["name"] == name]
    return [f["name"] for f in exp["fields"]]


@pytest.mark.slow  # a subprocess or a server: the slow suite (the default stays under 4 minutes)
def test_an_edited_module_is_imported_again_and_the_worker_runs_the_edit(tmp_path):
    exps = tmp_path / "exps.py"
    exps.write_text(TINY)

    async def main():
        async with Client(build_server(tmp_path, experiment_modules=("exps.py",))) as client:
            err, listing = await call(client, "nitro_experiments")
            assert not err, listing
            assert [e["name"] for e in listing["experiments"]] == [
                "CausalLM",
                "Classifier",
                "HFCausalLM",
                "Regression",
                "Tiny",
            ]
            assert listing["modules"] == [{"module": "exps.py", "experiments": ["Tiny"], "error": None,
                                           "traceback": [], "next": None}]  # fmt: skip
            assert "width" not in _fields(listing, "Tiny")
            exps.write_text(TINY + "    width: int = 3\n")
            err, listing = await call(client, "nitro_experiments")
            assert _fields(listing, "Tiny")[-1] == "width"
            err, job = await call(client, "nitro_train", experiment="Tiny",
                                  overrides={"width": 5, "max_epochs": 1})  # fmt: skip
            assert not err, job
            status = await wait_done(client, job["job_id"])
            assert status["state"] == "succeeded", status  # the worker knows the new field

    anyio.run(main)


def test_a_broken_module_is_listed_and_named_when_its_class_is_called_for(tmp_path):
    exps = tmp_path / "exps.py"
    exps.write_text(TINY)

    async def main():
        async with Client(build_server(tmp_path, experiment_modules=("exps.py",))) as client:
            assert not (await call(client, "nitro_experiments"))[0]
            exps.write_text(TINY + "    def (\n")
            err, listing = await call(client, "nitro_experiments")
            assert not err, listing
            assert [e["name"] for e in listing["experiments"]] == [
                "CausalLM",
                "Classifier",
                "HFCausalLM",
                "Regression",
            ]
            assert listing["modules"] == [{
                "module": "exps.py", "experiments": [], "error": "SyntaxError: invalid syntax (exps.py, line 8)",
                "traceback": ['  File "exps.py", line 8', "    def (", "        ^", "SyntaxError: invalid syntax"],
                "next": FIX,
            }]  # fmt: skip
            err, text = await call(client, "nitro_train", experiment="Tiny")
            assert err and text == (
                "Error executing tool nitro_train: Experiment 'Tiny' comes from the experiment module 'exps.py', "
                f"which failed to import: SyntaxError: invalid syntax (exps.py, line 8). {FIX}"
            )  # fmt: skip
            err, text = await call(client, "nitro_validate", experiment="Tinny")
            assert err and text == (
                "Error executing tool nitro_validate: Unknown experiment 'Tinny'; registered experiments are: "
                "CausalLM, Classifier, HFCausalLM, Regression. Use one of those names, or register yours with the 'nitro.experiments' "
                "entry-point group or --experiment-module when starting the server. The experiment module "
                "'exps.py' failed to import and may define it: SyntaxError: invalid syntax (exps.py, line 8). "
                f"{FIX}"
            )  # fmt: skip
            exps.write_text(TINY + "\nraise RuntimeError('no data here')\n")
            err, listing = await call(client, "nitro_experiments")
            assert listing["modules"][0]["error"] == "RuntimeError: no data here (exps.py, line 9)"
            assert listing["modules"][0]["traceback"] == [
                '  File "exps.py", line 9, in <module>',
                "    raise RuntimeError('no data here')",
                "RuntimeError: no data here",
            ]
            exps.write_text(TINY)  # fixed: the next call finds the class again
            err, listing = await call(client, "nitro_experiments")
            assert listing["modules"][0]["experiments"] == ["Tiny"] and "Tiny" in [
                e["name"] for e in listing["experiments"]
            ]

    anyio.run(main)


def test_a_dotted_module_imports_from_the_root_and_each_class_is_listed_once(tmp_path):
    name = f"exps_{uuid.uuid4().hex[:8]}"  # unique: modules stay in sys.modules across tests
    (tmp_path / f"{name}.py").write_text(TINY + "\n\nclass Regression(Tiny):\n    pass\n")

    async def main():
        async with Client(build_server(tmp_path, experiment_modules=(name,))) as client:
            err, listing = await call(client, "nitro_experiments")
            assert not err, listing
            names = [e["name"] for e in listing["experiments"]]
            # a class whose name is taken (the built-in Regression) keeps its module's prefix
            assert names == [
                "CausalLM",
                "Classifier",
                "HFCausalLM",
                "Regression",
                "Tiny",
                f"{name}.Regression",
            ]
            assert listing["modules"][0]["experiments"] == ["Tiny", f"{name}.Regression"]

    anyio.run(main)


def test_a_module_that_is_not_there_or_outside_the_root_is_listed_not_fatal(tmp_path):
    outside = tmp_path.parent / f"outside_{uuid.uuid4().hex[:8]}.py"
    outside.write_text(TINY)
    root = tmp_path / "root"
    root.mkdir()
    modules = ("missing.py", "no_such_module_here", str(outside), "not a module")

    async def main():
        async with Client(build_server(root, experiment_modules=modules)) as client:
            err, listing = await call(client, "nitro_experiments")
            assert not err, listing
            return [(m["module"], m["error"]) for m in listing["modules"]]

    assert anyio.run(main) == [
        ("missing.py", f"there is no file 'missing.py' under the root {str(root)!r}; give a .py file inside "
         "the root, by its path relative to the root, e.g. 'experiments.py'"),
        ("no_such_module_here", "ModuleNotFoundError: No module named 'no_such_module_here'; give a module "
         f"importable from the root {str(root)!r} or the server's environment, or a .py file inside the root, "
         "e.g. 'experiments.py'"),
        (str(outside), f"{str(outside)!r} is outside the root {str(root)!r}; give a .py file inside the root, by "
         "its path relative to the root, e.g. 'experiments.py'"),
        ("not a module", "'not a module' is neither a dotted module name nor a .py file path; write e.g. "
         "'my_pkg.experiments' or 'experiments.py'"),
    ]  # fmt: skip


@pytest.mark.slow  # a subprocess or a server: the slow suite (the default stays under 4 minutes)
def test_a_bad_experiment_module_does_not_stop_nitro_serve(tmp_path):
    """Over real stdio: a module that prints to stdout and raises at import leaves the server
    up and its JSON-RPC channel clean; the client connects and reads the error."""
    (tmp_path / "noisy.py").write_text("print('hello from import')\nimport no_such_dependency\n")
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "nitro_mcp.cli", "serve", "--root", str(tmp_path),
              "--experiment-module", "noisy.py", "--experiment-module", "absent_module"],
        env=dict(os.environ),
    )  # fmt: skip

    async def main():
        async with Client(params) as client:
            return await call(client, "nitro_experiments")

    err, listing = anyio.run(main)
    assert not err, listing
    assert [(m["module"], m["error"]) for m in listing["modules"]] == [
        ("noisy.py", "ModuleNotFoundError: No module named 'no_such_dependency' (noisy.py, line 2)"),
        ("absent_module", "ModuleNotFoundError: No module named 'absent_module'; give a module importable "
         f"from the root {str(tmp_path)!r} or the server's environment, or a .py file inside the root, "
         "e.g. 'experiments.py'"),
    ]  # fmt: skip
    assert [e["name"] for e in listing["experiments"]] == [
        "CausalLM",
        "Classifier",
        "HFCausalLM",
        "Regression",
    ]


def test_what_a_module_prints_at_import_goes_to_stderr(tmp_path, capsys):
    """stdout is the MCP stdio channel: a module's print at import must not land there."""
    from nitro_core.registry import load_module

    (tmp_path / "chatty.py").write_text(TINY + "\nprint('imported')\n")
    load = load_module("chatty.py", tmp_path)
    out = capsys.readouterr()
    assert [n for n, _ in load.classes] == ["Tiny"] and load.error is None
    assert out.out == "" and out.err == "imported\n"


def test_a_module_of_many_experiments_is_listed_within_the_reply_budget(tmp_path):
    classes = "".join(
        f'\n\nclass Wide{i:02d}(Regression):\n    """Variant {i} of the regression."""\n\n'
        + "".join(f"    extra_{k}: int = {k}\n" for k in range(8))
        for i in range(40)
    )
    (tmp_path / "many.py").write_text("from nitro_core.examples import Regression\n" + classes)

    async def main():
        async with Client(build_server(tmp_path, experiment_modules=("many.py",))) as client:
            whole = await client.call_tool("nitro_experiments", {})
            one = await client.call_tool("nitro_experiments", {"name": "Wide39"})
            return whole, one

    whole, one = anyio.run(main)
    listing = whole.structured_content
    described = [e["name"] for e in listing["experiments"]]
    assert len(whole.content[0].text) < 8_000
    assert described + listing["more"] == [
        *sorted(EXAMPLES),
        *(f"Wide{i:02d}" for i in range(40)),
    ]
    assert listing["next"] == (
        f"{len(listing['more'])} more experiments, listed by name in 'more': "
        f"nitro_experiments(name={listing['more'][0]!r}) describes one."
    )
    assert [e["name"] for e in one.structured_content["experiments"]] == ["Wide39"]
    assert _fields(one.structured_content, "Wide39")[-1] == "extra_7"


HOSTILE = {  # module file -> its source: each would stop the server if imported plainly
    "hangs.py": "import time\ntime.sleep(600)\n",
    "reads_stdin.py": "import sys\nDATA = sys.stdin.read()\nNAME = input()\n",
    "interrupts.py": "raise KeyboardInterrupt('from the import')\n",
    "writes_fd1.py": "import os\nos.write(1, b'not JSON-RPC\\n')\n",
}


@pytest.mark.slow  # a server subprocess and hanging imports: the slow suite (the default stays under 4 minutes)
def test_modules_that_hang_read_stdin_interrupt_or_write_fd_1_leave_nitro_serve_answering(tmp_path):
    """Over real stdio: initialize and tools/list are answered, the JSON-RPC channel stays
    clean (a stray line on it would break the client's parse), and each module's failure is
    listed as its error and named when its experiment is asked for."""
    for name, text in HOSTILE.items():
        (tmp_path / name).write_text(text)
    modules = [a for name in HOSTILE for a in ("--experiment-module", name)]
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "nitro_mcp.cli", "serve", "--root", str(tmp_path), "--import-timeout", "2", *modules],
        env=dict(os.environ),
    )  # fmt: skip

    async def main():
        with anyio.fail_after(60):
            async with Client(params) as client:
                tools = await client.list_tools()
                listing = await call(client, "nitro_experiments")
                refusal = await call(client, "nitro_train", experiment="Hung")
                return [t.name for t in tools.tools], listing, refusal

    names, (err, listing), (refused, text) = anyio.run(main)
    assert "nitro_train" in names and not err, listing
    assert [(m["module"], m["error"]) for m in listing["modules"]] == [
        ("hangs.py", "the import did not finish within 2 s (does it wait for input, a lock or the network at "
         "import?); move that work out of the import, or raise the limit with nitro serve --import-timeout"),
        ("reads_stdin.py", "EOFError: EOF when reading a line (reads_stdin.py, line 3)"),
        ("interrupts.py", "KeyboardInterrupt: from the import (interrupts.py, line 1)"),
        ("writes_fd1.py", None),
    ]  # fmt: skip
    assert refused and "The experiment module 'hangs.py' failed to import and may define it: the " \
        "import did not finish within 2 s" in text, text  # fmt: skip
