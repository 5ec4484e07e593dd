"""bench/structure.py, the AST measure of issue 20: exact findings on a tiny package tree (a
cycle closed only by a ``TYPE_CHECKING`` import, a layer violation, a local import of a light
module, a private access, the selector, hasattr and commit-call counts), and a run on this
repository."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "structure.py"

TREE = {
    "nitro_core/__init__.py": '"""Core."""\n',
    "nitro_core/errors.py": (
        '"""Errors, and nothing else."""\n'
        "from typing import TYPE_CHECKING\n"
        "\n"
        "if TYPE_CHECKING:\n"
        "    from nitro_core.store import disk\n"
    ),
    "nitro_core/store/__init__.py": '"""Store."""\n',
    "nitro_core/store/disk.py": (
        '"""Disk."""\n'
        "import os\n"
        "\n"
        "from ..errors import Fail\n"
        "\n"
        "\n"
        "class Box:\n"
        "    def get(self, other, path):\n"
        "        # a light import hidden in a function, and a heavy one allowed there\n"
        "        import json\n"
        "        import torch\n"
        "\n"
        "        self._mine = json.dumps(other._secret)\n"
        "        os.replace(path, path)\n"
        "        os.fsync(3)\n"
        "        fsync_dir(path)\n"
        "        return isinstance(other, (Best, Last)), torch, Fail\n"
    ),
    "nitro_mcp/__init__.py": '"""MCP."""\n',
    "nitro_mcp/server.py": (
        '"""Server."""\nfrom nitro_core.store import disk\n\nOK = hasattr(disk, "Box")\n'
    ),
    "tests/test_import_graph.py": (
        'LAYERS = (("nitro_core.errors",), ("nitro_core.store",), ("nitro_core",), ("nitro_mcp",))\n'
    ),
}


def load_script():
    spec = importlib.util.spec_from_file_location("structure", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_findings_on_a_tiny_tree_are_exact(tmp_path):
    for rel, text in TREE.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    script = load_script()
    r = json.loads(json.dumps(script.measure(tmp_path)))  # what --json prints
    assert r["totals"] == {
        "nitro_core": {"modules": 4, "lines": 24, "code_lines": 18},
        "nitro_mcp": {"modules": 2, "lines": 5, "code_lines": 4},
    }
    assert r["modules"][1] == {
        "path": "nitro_core/errors.py",
        "lines": 5,
        "code_lines": 4,
        "doc": "Errors, and nothing else.",
    }
    assert r["cycles"] == [
        {
            "modules": ["nitro_core.errors", "nitro_core.store.disk"],
            "closed_by": "type_checking",
            "edges": [
                {
                    "from": "nitro_core.errors",
                    "to": "nitro_core.store.disk",
                    "kind": "type_checking",
                    "at": "nitro_core/errors.py:5",
                },
                {
                    "from": "nitro_core.store.disk",
                    "to": "nitro_core.errors",
                    "kind": "module",
                    "at": "nitro_core/store/disk.py:4",
                },
            ],
        }
    ]
    assert r["layers_from"] == "tests/test_import_graph.py"
    assert r["layer_violations"] == [
        {
            "from": "nitro_core.errors",
            "to": "nitro_core.store.disk",
            "kind": "type_checking",
            "at": "nitro_core/errors.py:5",
            "layers": [0, 1],
        }
    ]
    assert r["unlayered"] == []
    assert r["functions"] == [{"lines": 10, "name": "Box.get", "at": "nitro_core/store/disk.py:8"}]
    assert r["classes"] == [
        {"lines": 11, "name": "Box", "methods": 1, "at": "nitro_core/store/disk.py:7"}
    ]
    assert r["local_imports"] == [
        {"at": "nitro_core/store/disk.py:10", "imports": "json", "in": "Box.get"}
    ]
    assert r["private_access"] == {
        "nitro_core/store/disk.py": {"count": 1, "by": {"other._secret": 1}}
    }
    assert r["hasattr"] == {"nitro_mcp/server.py": 1}
    assert r["selector_isinstance"] == {
        "nitro_core/store/disk.py": {"count": 1, "by": {"Box.get": 1}}
    }
    assert r["commit_calls"] == {
        "nitro_core/store/disk.py": {
            "count": 3,
            "by": {"fsync_dir": 1, "os.fsync": 1, "os.replace": 1},
        }
    }
    text = script.text(r)
    assert "closed by a type_checking import: nitro_core.errors, nitro_core.store.disk\n" in text
    assert "## Layer violations (layer numbers from tests/test_import_graph.py)\n" in text


def test_it_measures_this_repository():
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(ROOT), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    r = json.loads(run.stdout)
    assert sorted(r["totals"]) == ["nitro_core", "nitro_mcp"]
    assert all(t["modules"] > 0 and t["lines"] > 0 for t in r["totals"].values())
    assert r["layers_from"] == "tests/test_import_graph.py"
    assert r["unlayered"] == []
    assert len(r["functions"]) == 15 and len(r["classes"]) == 10
