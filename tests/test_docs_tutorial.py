"""docs/tutorial/first-hour.md as written: its commands name commands and options that exist,
its first Python block runs, and its other blocks call only what graft exports."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import click
import pytest

import graft
from graft_experiments.cli import main

PAGE = Path(__file__).resolve().parents[1] / "docs" / "tutorial" / "first-hour.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), re.DOTALL)


def _command_lines() -> list[list[str]]:
    lines = []
    for block in _blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line)
            if words and words[0] == "graft-exp":
                lines.append(words[1:])
    return lines


def test_every_command_and_option_the_tutorial_types_exists():
    lines = _command_lines()
    assert len(lines) >= 4
    for words in lines:
        command = main.commands.get(words[0])
        assert isinstance(command, click.Command), f"no command graft-exp {words[0]}"
        known = {opt for param in command.params for opt in param.opts + param.secondary_opts}
        for word in words[1:]:
            if word.startswith("--"):
                assert word in known, f"graft-exp {words[0]} has no option {word}"


def test_every_graft_name_the_tutorial_calls_exists():
    names = set()
    for block in _blocks("python"):
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "graft":
                names.add(node.attr)
    assert {"graft_texts", "target_metrics", "load_model", "tiny_pair"} <= names
    assert all(hasattr(graft, name) for name in names), names


@pytest.mark.slow
def test_the_first_graft_runs_as_written(capsys):
    exec(compile(_blocks("python")[0], f"{PAGE.name}: first block", "exec"), {})
    out = capsys.readouterr().out
    assert "FE+LT:all:all" in out and "target_rank" in out
