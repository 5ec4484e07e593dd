"""`nitro --version`, `nitro --help` and every command's --help: what it does in one line and
one example, which parses. The commands are read from the parser, so one added later is
covered too."""

from __future__ import annotations

import argparse
import shlex

import pytest

from nitro_core import __version__
from nitro_mcp.cli import _parser, main


def _commands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"nitro {__version__}\n"


def test_top_level_help_lists_every_command_with_its_summary_and_an_example(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "Nitro: trustworthy PyTorch checkpoints, and an MCP server for agents." in out
    assert "example:\n  nitro demo\n" in out
    for name, command in _commands().items():
        assert f"    {name}" in out and command.description in out, name


@pytest.mark.parametrize("name", sorted(_commands()))
def test_every_command_says_what_it_does_in_one_line_and_shows_one_example(name, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([name, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    summary = _commands()[name].description
    assert summary and "\n" not in summary, f"`nitro {name}` has no one-line description"
    assert f"\n\n{summary}\n\n" in out
    _, _, example = out.partition("\nexample:\n  ")
    assert example.count("\n") == 1, (
        f"`nitro {name} --help` shows no example: add one to EXAMPLES in nitro_mcp/cli.py"
    )
    words = shlex.split(example)
    assert words[:2] == ["nitro", name]
    assert _parser().parse_args(words[1:]).command == name  # the example is a valid call
