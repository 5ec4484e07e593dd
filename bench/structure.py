"""The code structure of nitro_core and nitro_mcp, read from the AST (the measuring stick of
issue 20's "one of each" restructure; quote its output before and after).

It reports: the module tree (path, physical lines, first docstring line); the lines of each
package (physical, and non-blank non-comment); import cycles (Tarjan's strongly connected
components over module-level, function-local and ``if TYPE_CHECKING:`` imports, each cycle
with the weakest kind of edge that closes it); imports from a later layer into an earlier
one (the ``LAYERS`` table of the measured checkout's tests/test_import_graph.py, read by
``ast.literal_eval`` rather than copied); the 15 largest functions and 10 largest
classes; function-local imports of anything but torch, numpy, safetensors, transformers and
mcp; ``x._name`` accesses where x is not self/cls and ``hasattr(`` calls; ``isinstance``
checks over the selector classes; and the commit protocol's call sites (``os.fsync``,
``fsync_dir``, ``os.replace``, ``os.rename``, ``os.link``). As in tests/test_import_graph.py,
``from pkg import name`` is an edge to ``pkg.name`` when that is a module, and an import of
a module's own parent package is no edge. Stdlib only:

    python bench/structure.py [--root DIR] [--json]
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

PACKAGES = ("nitro_core", "nitro_mcp")
HEAVY = {"torch", "numpy", "safetensors", "transformers", "mcp"}
SELECTORS = {"Best", "Last", "Every", "Epochs"}
COMMIT = {"fsync", "replace", "rename", "link"}
KINDS = ("module", "local", "type_checking")  # weakest (always runs) first
NAMEDTUPLE = {"_replace", "_asdict", "_fields", "_make"}


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


class Module(ast.NodeVisitor):
    """One module's facts: imports (with kind), functions, classes and the counted calls."""

    def __init__(self, name: str, rel: str, tree: ast.Module, is_pkg: bool) -> None:
        self.name, self.rel, self.is_pkg = name, rel, is_pkg
        self.imports: list[tuple[str, int, str, str]] = []  # (target, line, kind, qualname)
        self.functions: list[dict[str, Any]] = []
        self.classes: list[dict[str, Any]] = []
        self.private: Counter[str] = Counter()
        self.hasattr: Counter[str] = Counter()
        self.selector_checks: Counter[str] = Counter()
        self.commit: Counter[str] = Counter()
        self.scope: list[str] = []
        self.in_function = self.in_tc = False
        self.visit(tree)

    def where(self) -> str:
        return ".".join(self.scope) or "<module>"

    def _import(self, node: ast.Import | ast.ImportFrom, targets: list[str]) -> None:
        kind = "type_checking" if self.in_tc else "local" if self.in_function else "module"
        for t in targets:
            self.imports.append((t, node.lineno, kind, self.where()))

    def visit_Import(self, node: ast.Import) -> None:
        self._import(node, [a.name for a in node.names])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            pkg = self.name.split(".")
            pkg = pkg[: len(pkg) - node.level + (1 if self.is_pkg else 0)]
            base = ".".join([*pkg, base] if base else pkg)
        # "base:name" lets the graph pick base.name when it is a module, else base.
        self._import(node, [f"{base}:{a.name}" for a in node.names])

    def visit_If(self, node: ast.If) -> None:
        if ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            was, self.in_tc = self.in_tc, True
            for stmt in node.body:
                self.visit(stmt)
            self.in_tc = was
            for stmt in node.orelse:
                self.visit(stmt)
        else:
            self.generic_visit(node)

    def _scoped(self, node: ast.AST, name: str, function: bool) -> None:
        self.scope.append(name)
        was, self.in_function = self.in_function, self.in_function or function
        self.generic_visit(node)
        self.in_function = was
        self.scope.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        qual = ".".join([*self.scope, node.name])
        size = (node.end_lineno or node.lineno) - node.lineno + 1
        self.functions.append({"lines": size, "name": qual, "at": f"{self.rel}:{node.lineno}"})
        self._scoped(node, node.name, True)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        methods = sum(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for n in node.body)
        size, qual = (node.end_lineno or node.lineno) - node.lineno + 1, [*self.scope, node.name]
        at = f"{self.rel}:{node.lineno}"
        self.classes.append({"lines": size, "name": ".".join(qual), "methods": methods, "at": at})
        self._scoped(node, node.name, False)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        a, dunder = node.attr, node.attr.startswith("__") and node.attr.endswith("__")
        own = ast.unparse(node.value) in ("self", "cls", "super()")
        if a.startswith("_") and not dunder and not own and a not in NAMEDTUPLE:
            key = ast.unparse(node)
            key = key if len(key) <= 60 else "..." + key[-57:]
            self.private[key] += 1
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Name) and f.id == "hasattr":
            self.hasattr["hasattr"] += 1
        if isinstance(f, ast.Name) and f.id == "isinstance" and len(node.args) == 2:
            named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            named |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
            if named & SELECTORS:
                self.selector_checks[self.where()] += 1
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        on_os = isinstance(f, ast.Attribute) and ast.unparse(f.value) == "os"
        if name == "fsync_dir" or (on_os and name in COMMIT):
            self.commit[("os." if on_os else "") + name] += 1
        self.generic_visit(node)


def load_layers(root: Path) -> tuple[tuple[tuple[str, ...], ...], str]:
    """The ``LAYERS`` table of the measured checkout's tests/test_import_graph.py (one table,
    read, not copied); none when that checkout has no such table."""
    test = root / "tests" / "test_import_graph.py"
    for node in ast.parse(test.read_text()).body if test.is_file() else []:
        if isinstance(node, ast.AnnAssign | ast.Assign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "LAYERS" for t in targets):
                return ast.literal_eval(node.value), "tests/test_import_graph.py"
    return (), "nowhere: tests/test_import_graph.py has no LAYERS table, so none is checked"


def layer_of(module: str, layers: tuple[tuple[str, ...], ...]) -> int | None:
    best = (-1, -1)
    for i, prefixes in enumerate(layers):
        for p in prefixes:
            if module == p or module.startswith(p + "."):
                best = max(best, (len(p), i))
    return best[1] if best[1] >= 0 else None


def strong_components(nodes: list[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm; components of more than one module, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                comp.append(w)
            if comp:
                out.append(sorted([v, *comp]))

    sys.setrecursionlimit(10_000)
    for v in nodes:
        if v not in index:
            visit(v)
    return sorted(out)


def import_edges(
    mods: dict[str, Module], known: set[str]
) -> tuple[dict[tuple[str, str], tuple[int, str]], list[dict[str, str]]]:
    """Edges between project modules (weakest kind, where), and local non-heavy imports."""
    edge: dict[tuple[str, str], tuple[int, str]] = {}
    local: list[dict[str, str]] = []
    for name, m in mods.items():
        for target, line, kind, where in m.imports:
            base, _, attr = target.partition(":")
            mod = f"{base}.{attr}" if attr and f"{base}.{attr}" in known else base
            row = {"at": f"{m.rel}:{line}", "imports": mod, "in": where}
            if kind == "local" and mod.split(".")[0] not in HEAVY and row not in local:
                local.append(row)
            while mod not in known and "." in mod:
                mod = mod.rsplit(".", 1)[0]
            if mod in known and mod != name and not name.startswith(mod + "."):
                rank = KINDS.index(kind)
                if (name, mod) not in edge or rank < edge[(name, mod)][0]:
                    edge[(name, mod)] = (rank, f"{m.rel}:{line}")
    return edge, local


def find_cycles(edge: dict[tuple[str, str], tuple[int, str]], nodes: list[str]) -> list[Any]:
    """Each component with the weakest edge kind that still makes it cyclic, and its edges."""

    def adjacency(max_rank: int, within: set[str] | None = None) -> dict[str, set[str]]:
        adj: dict[str, set[str]] = {}
        for (a, b), (rank, _) in edge.items():
            if rank <= max_rank and (within is None or {a, b} <= within):
                adj.setdefault(a, set()).add(b)
        return adj

    cycles = []
    for comp in strong_components(nodes, adjacency(len(KINDS) - 1)):
        k = next(k for k in range(len(KINDS)) if strong_components(comp, adjacency(k, set(comp))))
        inner = [
            {"from": a, "to": b, "kind": KINDS[r], "at": at}
            for (a, b), (r, at) in sorted(edge.items())
            if {a, b} <= set(comp)
        ]
        cycles.append({"modules": comp, "closed_by": KINDS[k], "edges": inner})
    return cycles


def measure(root: Path) -> dict[str, Any]:
    paths = {
        module_name(root, p): p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))
    }
    mods: dict[str, Module] = {}
    rows, totals = [], {pkg: Counter(modules=0, lines=0, code_lines=0) for pkg in PACKAGES}
    for name, path in paths.items():
        source, rel = path.read_text(), path.relative_to(root).as_posix()
        tree = ast.parse(source, rel)
        mods[name] = Module(name, rel, tree, path.name == "__init__.py")
        lines = source.splitlines()
        code = sum(1 for x in lines if x.strip() and not x.strip().startswith("#"))
        doc = (ast.get_docstring(tree) or "").strip().split("\n")[0]
        rows.append({"path": rel, "lines": len(lines), "code_lines": code, "doc": doc})
        totals[name.split(".")[0]].update(modules=1, lines=len(lines), code_lines=code)
    edge, local_imports = import_edges(mods, set(paths))
    layers, layers_from = load_layers(root)
    violations = [
        {"from": a, "to": b, "kind": KINDS[rank], "at": at, "layers": [la, lb]}
        for (a, b), (rank, at) in sorted(edge.items())
        if a != "nitro_core"  # the lazy front door, as in tests/test_import_graph.py
        and (la := layer_of(a, layers)) is not None
        and (lb := layer_of(b, layers)) is not None
        and lb > la
    ]

    def top(key: str, n: int) -> list[dict[str, Any]]:
        items = [x for m in mods.values() for x in getattr(m, key)]
        return sorted(items, key=lambda x: (-x["lines"], x["at"]))[:n]

    def per_module(key: str) -> dict[str, dict[str, Any]]:
        counts = {m.rel: getattr(m, key) for m in mods.values() if getattr(m, key)}
        order = lambda kv: (-kv[1], kv[0])  # noqa: E731
        return {
            r: {"count": c.total(), "by": dict(sorted(c.items(), key=order))}
            for r, c in counts.items()
        }

    return {
        "root": str(root),
        "modules": rows,
        "totals": {p: dict(t) for p, t in totals.items()},
        "cycles": find_cycles(edge, sorted(paths)),
        "layers_from": layers_from,
        "layer_violations": violations,
        "unlayered": sorted(n for n in paths if layers and layer_of(n, layers) is None),
        "functions": top("functions", 15),
        "classes": top("classes", 10),
        "local_imports": local_imports,
        "private_access": per_module("private"),
        "hasattr": {r: v["count"] for r, v in per_module("hasattr").items()},
        "selector_isinstance": per_module("selector_checks"),
        "commit_calls": per_module("commit"),
    }


def text(r: dict[str, Any]) -> str:
    def counted(rows: dict[str, dict[str, Any]], most: int = 99) -> list[str]:
        by = {
            p: ", ".join(f"{k} x{n}" for k, n in list(v["by"].items())[:most])
            for p, v in rows.items()
        }
        return [f"{p:<44} {v['count']:>4}  {by[p]}" for p, v in rows.items()]

    cycles = []
    for c in r["cycles"]:
        cycles.append(f"closed by a {c['closed_by']} import: {', '.join(c['modules'])}")
        cycles += [f"    {e['from']} -> {e['to']}  [{e['kind']}] {e['at']}" for e in c["edges"]]
    wrong = [
        f"{v['from']} ({v['layers'][0]}) -> {v['to']} ({v['layers'][1]})  [{v['kind']}] {v['at']}"
        for v in r["layer_violations"]
    ] + ([f"in no layer: {', '.join(r['unlayered'])}"] if r["unlayered"] else [])
    sections = {
        "Modules (path, lines, docstring)": [
            f"{m['path']:<44} {m['lines']:>5}  {m['doc']}" for m in r["modules"]
        ],
        "Totals (modules, physical lines, non-blank non-comment lines)": [
            f"{p:<12} {t['modules']:>4} {t['lines']:>7} {t['code_lines']:>7}"
            for p, t in r["totals"].items()
        ],
        "Import cycles (module-level, local and TYPE_CHECKING imports)": cycles,
        f"Layer violations (layer numbers from {r['layers_from']})": wrong,
        "Largest functions (lines, name, where)": [
            f"{f['lines']:>5}  {f['name']:<48} {f['at']}" for f in r["functions"]
        ],
        "Largest classes (lines, methods, name, where)": [
            f"{c['lines']:>5} {c['methods']:>4}  {c['name']:<42} {c['at']}" for c in r["classes"]
        ],
        "Function-local imports not of torch, numpy, safetensors, transformers, mcp": [
            f"{i['at']:<44} {i['imports']:<36} in {i['in']}" for i in r["local_imports"]
        ],
        "Private attributes of other objects (count, most frequent)": counted(
            r["private_access"], 4
        ),
        "hasattr( calls": [f"{p:<44} {n:>4}" for p, n in r["hasattr"].items()],
        "isinstance checks over Best, Last, Every, Epochs": counted(r["selector_isinstance"]),
        "Commit protocol call sites (os.fsync, fsync_dir, os.replace, os.rename, os.link)": counted(
            r["commit_calls"]
        ),
    }
    out = [f"Structure of {r['root']} ({', '.join(PACKAGES)})"]
    for title, lines in sections.items():
        out += ["", f"## {title}", *(lines or ["none"])]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--json", action="store_true", help="machine output")
    args = parser.parse_args()
    missing = [p for p in PACKAGES if not (args.root / p).is_dir()]
    if missing:
        parser.error(
            f"--root {args.root} has no {', '.join(missing)} directory; pass a checkout of Nitro"
        )
    result = measure(args.root.resolve())
    print(json.dumps(result, indent=2) if args.json else text(result))


if __name__ == "__main__":
    main()
