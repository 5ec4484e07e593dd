"""The documentation site cannot drift from the code: its runnable blocks run, every MCP
tool has a documented call and reply that match the tool's schemas, the record-format page
names every header field a real record has, and `mkdocs build --strict` fails on a broken
link or a missing API reference. How blocks are marked: tests/markdown_blocks.py."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys

import jsonschema
import pytest

import nitro_core
from nitro_core import ManifestEntry, Nitro, checkpoint_info, read_manifest
from nitro_core.examples import Regression
from nitro_core.state.header import RecordHeader
from nitro_mcp.schemas import generate

from .markdown_blocks import REPO, blocks, failure, files_of, param, run_block

DOCS = REPO / "docs"
PAGES = {p.relative_to(DOCS).as_posix(): blocks(p.read_text()) for p in sorted(DOCS.rglob("*.md"))}
SCHEMAS = generate()  # what the server answers now (test_schemas_and_cli keeps schemas/ equal)
TOOLS = sorted(k.removeprefix("tools/").removesuffix(".input.json") for k in SCHEMAS if k.endswith(".input.json"))  # fmt: skip


@pytest.mark.parametrize(
    ("page", "block"),
    [param(b, page, prefix=f"{page}-") for page, bs in PAGES.items() for b in bs if b.runnable],
)
def test_every_runnable_docs_block_runs(page, block, tmp_path):
    done = run_block(block, tmp_path, files_of(PAGES[page]))
    assert done.returncode == 0, failure(f"docs/{page}", block, done)


@pytest.mark.parametrize(
    ("page", "line", "text"),
    [(p, b.line, b.text) for p, bs in PAGES.items() for b in bs if b.lang == "json"],
)
def test_every_json_block_parses(page, line, text):
    json.loads(text)


TOOL_PAGES = ("mcp.md", "research-loops.md")  # pages whose marked calls and replies are checked


def _documented(kind: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for b in (b for page in TOOL_PAGES for b in PAGES[page]):
        if b.mark and b.mark.startswith(f"{kind}:"):
            found.setdefault(b.mark.removeprefix(f"{kind}:"), []).append(b.text)
    return found


@pytest.mark.parametrize("tool", TOOLS)
def test_every_mcp_tool_has_a_call_and_reply_that_match_its_schemas(tool):
    calls, replies = _documented("call").get(tool, []), _documented("reply").get(tool, [])
    assert calls and replies, (
        f"docs/mcp.md shows no <!-- call: {tool} --> and <!-- reply: {tool} -->"
    )
    for text in calls:
        jsonschema.validate(json.loads(text), SCHEMAS[f"tools/{tool}.input.json"])
    output = SCHEMAS.get(f"tools/{tool}.output.json")
    for text in replies:
        if output is not None:  # nitro_plot returns image content, not structured data
            jsonschema.validate(json.loads(text), output)


def test_the_mcp_page_documents_only_real_tools():
    assert set(_documented("call")) <= set(TOOLS)
    assert set(_documented("reply")) <= set(TOOLS)


def _header_section_names() -> set[str]:
    text = (DOCS / "record-format.md").read_text()
    section = text.split("## The header", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`(\w+)`", row)}


def test_the_record_format_page_names_every_header_field_of_a_real_record(tmp_path):
    n = Nitro(Regression(max_epochs=1, samples=64), run_dir=tmp_path).train()
    header = checkpoint_info(tmp_path / read_manifest(tmp_path)[-1].file)
    documented = _header_section_names()
    assert set(header) <= documented, f"undocumented header fields: {set(header) - documented}"
    known = set(header) | set(RecordHeader.model_fields)
    assert documented <= known, f"documented fields no record has: {documented - known}"
    assert n.epoch == 1


def test_the_record_format_pages_manifest_entry_has_only_real_fields():
    text = (DOCS / "record-format.md").read_text().split("## The manifest", 1)[1]
    entry = next(b for b in blocks(text) if b.lang == "json")
    assert set(json.loads(entry.text)) <= set(ManifestEntry.model_fields)


def _build(where, edit=None) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of a copy of the site in ``where``, after ``edit(docs)``."""
    shutil.copytree(DOCS, where / "docs")
    shutil.copy(REPO / "mkdocs.yml", where)
    if edit:
        edit(where / "docs")
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(where / "site")]
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "NO_MKDOCS_2_WARNING": "1",
    }  # mkdocstrings imports nitro_core
    return subprocess.run(cmd, cwd=where, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    """The site as `mkdocs build --strict` writes it (site/), built once for the session and
    shared by every test that reads it (the build must pass: the fixture asserts it)."""
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    where = tmp_path_factory.mktemp("site")
    done = _build(where)
    assert done.returncode == 0, done.stderr[-3000:]
    return where / "site"


@pytest.mark.slow  # three `mkdocs build --strict` in subprocesses (one of them the shared site)
def test_mkdocs_strict_build_passes_and_fails_on_a_broken_link_or_a_missing_reference(
    site, tmp_path
):
    assert (site / "reference" / "training" / "index.html").exists()  # built, strict, passed

    def broken_link(docs):
        (docs / "sources.md").write_text((docs / "sources.md").read_text() + "\n[x](nowhere.md)\n")

    done = _build(tmp_path / "link", broken_link)
    assert done.returncode != 0 and "nowhere.md" in done.stderr

    def missing_reference(docs):
        page = docs / "reference" / "training.md"
        page.write_text(page.read_text() + "\n::: nitro_core.NoSuchName\n")

    done = _build(tmp_path / "ref", missing_reference)
    assert done.returncode != 0 and "NoSuchName" in done.stderr


def _signatures(page) -> list[str]:
    """The rendered signatures of a reference page, as text (tags dropped, entities read)."""
    found = re.findall(r'<div class="doc-signature[^"]*"[^>]*>(.*?)</div>', page.read_text(), re.S)
    return [html.unescape(re.sub(r"<[^>]+>", "", s)).strip() for s in found]


@pytest.mark.parametrize(
    ("page", "name", "parameters"),
    [
        ("training", "Nitro", [
            "experiment: Experiment", "run_dir: str | Path | None = None",
            "seed: int | None = None", 'device: str | device = "auto"',
            "max_steps: int | None = None", "time_limit: float | None = None",
        ]),
        ("training", "TensorBatches", [
            "tensors: Mapping[str, Tensor]", "batch_size: int", "shuffle: bool = False",
        ]),
        ("training", "EMA", ["decay: float = 0.999"]),
        ("selection", "Checkpointer", [
            "keep: Selector | tuple[Selector, ...] | list[Selector] = (Best(3), Last(1))",
            "metric: str | None = None", "every_steps: int | None = None",
            "async_write: bool = True",
        ]),
    ],
)  # fmt: skip
@pytest.mark.slow  # reads the shared site: one build, in the slow suite's one process
def test_the_reference_shows_the_constructor_a_user_types(site, page, name, parameters):
    """The class's heading carries its __init__ signature (merge_init_into_class), with
    every parameter's type and default, one a line when long."""
    signatures = _signatures(site / "reference" / page / "index.html")
    (signature,) = [s for s in signatures if s.startswith(f"{name}(")]
    assert all(p in signature for p in parameters), signature
    assert not [s for s in signatures if s.startswith("__init__(")]  # no separate __init__


@pytest.mark.slow  # reads the shared site: one build, in the slow suite's one process
def test_code_blocks_stay_inside_the_content_column(site):
    css = (site / "stylesheets" / "extra.css").read_text()
    assert re.search(r"\.md-typeset pre > code \{[^}]*overflow-x: auto", css, re.S)
    assert re.search(r"\.doc-signature pre > code \{[^}]*white-space: pre-wrap", css, re.S)
    page = (site / "reference" / "training" / "index.html").read_text()
    assert 'href="../../stylesheets/extra.css"' in page


def _pasted(page: str, section: str) -> str:
    """A page's first runnable block, then the block of ``section``, as a reader pastes them."""
    first = next(b for b in PAGES[page] if b.runnable)
    then = next(b for b in PAGES[page] if b.section == section and b.lang == "python")
    return first.text + "\n" + then.text


def test_the_running_it_block_of_experiments_runs_when_pasted(tmp_path):
    script = tmp_path / "pasted.py"
    script.write_text(_pasted("experiments.md", "Running it"))
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "runs" / "sine" / "manifest.json").exists()


def test_the_api_reference_renders_every_public_name():
    text = "\n".join(p.read_text() for p in (DOCS / "reference").glob("*.md"))
    rendered = set(re.findall(r"^::: nitro_core\.(\w+)$", text, re.M))
    assert rendered == set(nitro_core.__all__) - {"__version__"}


def test_the_benchmarks_page_names_every_script_under_bench():
    text = (DOCS / "benchmarks.md").read_text()
    scripts = {p.name for p in (REPO / "bench").iterdir() if p.suffix in (".py", ".sh")}
    assert {s for s in scripts if f"`{s}`" not in text} == set()
