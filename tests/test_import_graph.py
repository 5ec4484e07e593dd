"""The import graph of both packages, read from the AST: no cycle anywhere, every module
imports only from its own layer or the layers before it, a function-local import of the
project's own code is deliberate lazy loading (commented ``# lazy``), and the light entry
points do not import torch."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("nitro_core", "nitro_mcp")

# Layers, first to last (DESIGN.md section 8): a module may import from its own layer and
# the ones before it. Prefixes are matched longest first.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("nitro_core.errors", "nitro_core._version"),
    ("nitro_core.store",),
    ("nitro_core.policy", "nitro_core.sources"),
    ("nitro_core.state",),
    (
        "nitro_core.averaging",
        "nitro_core.export",
        "nitro_core.info",
        "nitro_core.deletion",
        "nitro_core.verification",
        "nitro_core.transfer",
    ),
    ("nitro_core.experiment", "nitro_core.training"),
    ("nitro_core.examples", "nitro_core.registry", "nitro_core.hf_export"),
    ("nitro_core.jobs",),
    ("nitro_core",),  # the package's lazy front door
    ("nitro_mcp",),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


@functools.cache
def imports(name: str, path: Path) -> list[tuple[str, int, bool, str]]:
    """(imported module, line, at function level, the line's text) for project imports."""
    tree = ast.parse(path.read_text(), str(path))
    lines = path.read_text().splitlines()
    known = modules()
    typing_only = _type_checking_only(tree)
    found = []

    def visit(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = local or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    pkg = name.split(".")
                    if not path.name == "__init__.py":
                        pkg = pkg[:-1]
                    pkg = pkg[: len(pkg) - child.level + 1]
                    base = ".".join([*pkg, base] if base else pkg)
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in child.names
                ]
            for t in targets:
                if t.split(".")[0] in PACKAGES and id(child) not in typing_only:
                    found.append((t, child.lineno, local, lines[child.lineno - 1]))
            visit(child, inner)

    visit(tree, False)
    return found


def _type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes under an ``if TYPE_CHECKING:`` block of ``tree``."""
    return {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If)
        and isinstance(block.test, ast.Name)
        and block.test.id == "TYPE_CHECKING"
        for stmt in block.body
        for n in ast.walk(stmt)
    }


def graph() -> dict[str, set[str]]:
    known = modules()
    edges: dict[str, set[str]] = {m: set() for m in known}
    for name, path in known.items():
        for target, *_ in imports(name, path):
            while target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in known and target != name and not name.startswith(target + "."):
                edges[name].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in edges:
        if v not in index:
            strong(v)
    return out


def layer(module: str) -> int:
    best = (-1, -1)
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if module == p or module.startswith(p + "."):
                best = max(best, (len(p), i))
    assert best[1] >= 0, f"{module} is in no layer; add it to LAYERS"
    return best[1]


def test_the_import_graph_has_no_cycle():
    assert cycles(graph()) == []


def test_a_module_imports_only_from_its_layer_or_the_ones_before():
    wrong = [
        f"{m} (layer {layer(m)}) imports {t} (layer {layer(t)})"
        for m, targets in graph().items()
        for t in targets
        if m != "nitro_core" and layer(t) > layer(m)
    ]
    assert wrong == []


def test_local_imports_of_project_code_are_commented_lazy_loads():
    hidden = [
        f"{name}:{line}: {text.strip()}"
        for name, path in modules().items()
        for _, line, local, text in imports(name, path)
        if local and "# lazy" not in text
    ]
    assert hidden == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize(
    "code",
    [
        "import nitro_core.errors",
        "import nitro_core",
        "from nitro_core import NitroError, __version__",
        "import nitro_mcp.cli",
    ],
)
def test_light_imports_do_not_load_torch(code):
    probe = f"{code}; import sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


TOOLS = {  # tools shipped beside the product, and the one entry point each may be reached by
    "nitro_core.jobs.slurm_local": set(),  # python -m nitro_core.jobs.slurm_local up|down|status
    "nitro_mcp.demo": {"nitro_mcp.cli.serving_commands"},  # nitro demo
}


def test_the_loopback_cluster_and_the_demo_are_tools_no_product_path_imports():
    """The loopback Slurm launcher and the demo driver ship in the wheel, importable where
    DESIGN names them, but no code path of the product imports them (issue 33, point 6)."""
    importers = {tool: {m for m, targets in graph().items() if tool in targets} for tool in TOOLS}
    assert importers == TOOLS, importers
