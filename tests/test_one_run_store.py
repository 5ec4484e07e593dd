"""One run store (DESIGN section 17), counted from the AST as the import graph is: above
``nitro_core/store/`` nothing asks which medium a run directory or a record lives on, and
sources carry their meaning as methods, not ``isinstance`` chains.

Each count names the sites it found, so a new one reads as a line to fix, not a number."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "nitro_core" / "store"
SOURCES = ROOT / "nitro_core" / "sources"
SOURCE_CLASSES = {"Pair", "PathSource", "HFDirectory", "Source"}


def modules(skip: tuple[Path, ...]) -> Iterator[tuple[str, ast.AST]]:
    for package in ("nitro_core", "nitro_mcp"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if any(path.is_relative_to(s) for s in skip):
                continue
            yield str(path.relative_to(ROOT)), ast.parse(path.read_text(), str(path))


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def medium_questions(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """The places a module asks which medium something is on: ``is_url(...)``, ``storage is
    (not) None``, ``isinstance(..., ObjectUrl)``, and imports of the object store's modules."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node.func) == "is_url":
            yield node.lineno, "is_url(...)"
        if isinstance(node, ast.Compare) and _name(node.left) == "storage":
            if any(isinstance(op, ast.Is | ast.IsNot) for op in node.ops):
                yield node.lineno, "storage is (not) None"
        if isinstance(node, ast.Call) and _name(node.func) == "isinstance" and len(node.args) == 2:
            if "ObjectUrl" in ast.unparse(node.args[1]):
                yield node.lineno, "isinstance(..., ObjectUrl)"
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            names = {a.name for a in node.names}
            if node.module == "nitro_core.store.object_run" or "object_run" in names:
                yield node.lineno, "imports store.object_run"


def source_chains(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``isinstance`` over the source classes (and over ``src.pick``)."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _name(node.func) == "isinstance"):
            continue
        if len(node.args) != 2:
            continue
        classes = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
        if classes & SOURCE_CLASSES or ast.unparse(node.args[0]).endswith(".pick"):
            yield node.lineno, ast.unparse(node)


def test_nothing_above_the_store_asks_which_medium_a_run_lives_on():
    found = [
        f"{name}:{line}: {what}"
        for name, tree in modules(skip=(STORE,))
        for line, what in medium_questions(tree)
    ]
    assert found == [], "ask the RunStore (store/run.py) or the Place (store/place.py) instead"


def test_the_count_sees_a_planted_medium_question():
    """The counter itself: each form it looks for is found in a module that has it."""
    planted = ast.parse(
        "from nitro_core.store import object_run\n"
        "if objects.is_url(run_dir): pass\n"
        "if self.storage is None: pass\n"
        "if isinstance(where, ObjectUrl): pass\n"
    )
    assert [what for _, what in medium_questions(planted)] == [
        "imports store.object_run",
        "is_url(...)",
        "storage is (not) None",
        "isinstance(..., ObjectUrl)",
    ]


def test_sources_carry_their_meaning_as_methods_not_isinstance_chains():
    found = [
        f"{name}:{line}: {call}"
        for name, tree in modules(skip=(SOURCES,))
        for line, call in source_chains(tree)
    ]
    assert found == [], "give the source classes a method (grammar.py) instead"
    planted = ast.parse("if isinstance(src, Pair) and isinstance(src.pick, Average): pass")
    assert len(list(source_chains(planted))) == 2


def test_a_source_answers_what_its_callers_ask():
    from nitro_core.sources.grammar import Average, parse_source

    averaged = parse_source("latest => Average(Last(3))")
    assert isinstance(averaged.averaged(), Average) and averaged.needs_manifest()
    assert averaged.record_path() is None and averaged.hf_directory() is None
    best = parse_source("latest => best")
    assert best.averaged() is None and best.rooted(lambda p: "/x/" + p) is best
    record = parse_source("runs/a/epoch-0001.safetensors")
    assert record.record_path() == "runs/a/epoch-0001.safetensors" and not record.needs_manifest()
    assert str(record.rooted(lambda p: "/root/" + p)) == "/root/runs/a/epoch-0001.safetensors"
    hf = parse_source("hf:models/gpt2")
    assert hf.hf_directory() == "models/gpt2" and hf.record_path() is None
    assert str(hf.rooted(lambda p: "/root/" + p)) == "hf:/root/models/gpt2"  # stays hf:
