"""The README cannot drift from the code: its runnable blocks run (the Python, terminal and
MCP sections each have one), its JSON parses, its quick start is the two commands, and it
names nothing outside the repository. How blocks are marked: tests/markdown_blocks.py."""

from __future__ import annotations

import json
import re

import pytest

from .markdown_blocks import REPO, Block, blocks, failure, files_of, param, run_block

README = REPO / "README.md"
BLOCKS = blocks(README.read_text())


@pytest.mark.parametrize("block", [param(b) for b in BLOCKS if b.runnable])
def test_every_runnable_readme_block_runs(block, tmp_path):
    done = run_block(block, tmp_path, files_of(BLOCKS))
    assert done.returncode == 0, failure("README.md", block, done)


def test_the_python_cli_and_mcp_sections_each_have_a_tested_block():
    tested = {b.section for b in BLOCKS if b.runnable}
    for section in ("Python", "For people at a terminal", "The MCP server"):
        assert section in tested, f"README section {section!r} has no runnable block"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang == "json"], ids=lambda b: b.id)
def test_every_json_block_parses(block):
    json.loads(block.text)


def test_the_quick_start_shows_the_two_commands_first():
    quick = next(b for b in BLOCKS if b.section == "Quick start")
    commands = [line.split("#")[0].strip() for line in quick.text.splitlines()]
    assert commands == ["./dev demo", "./dev test"]


def test_the_readme_names_nothing_outside_the_repository():
    text = README.read_text()
    assert "../" not in text and "shared/" not in text
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert links, "the README links its documentation pages"
    for target in links:
        if not re.match(r"[a-z]+:", target):  # a relative link: a file in this repository
            assert (REPO / target).exists(), f"README.md links to {target!r}, which is not here"


def test_the_block_reader_finds_marks_and_sections():
    text = (
        "## A\n<!-- runnable -->\n```bash\necho hi\n```\n\n## B\n"
        "<!-- file: x/y.py -->\n```python\nX = 1\n```\n```json\n{}\n```\n"
        "<!-- reply: nitro_status -->\n```json\n{}\n```\n"
    )
    assert blocks(text) == [
        Block("bash", "echo hi\n", "runnable", 3, "A"),
        Block("python", "X = 1\n", "file:x/y.py", 9, "B"),
        Block("json", "{}\n", None, 12, "B"),
        Block("json", "{}\n", "reply:nitro_status", 16, "B"),
    ]
