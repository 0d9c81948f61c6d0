"""Every page a command's help or docstring names exists, and every section it names is a
heading there: help that points at documentation cannot point at nothing."""

from __future__ import annotations

import re
from pathlib import Path

import click

from graft_experiments.cli import main
from tests.test_docstring_references import python_name_resolves

ROOT = Path(__file__).resolve().parents[2]
PAGE = re.compile(r"((?:docs/)?(?:[\w-]+/)*[\w-]+\.md)(#[\w-]+)?")


def _texts(command: click.Command, path: str = "graft-exp") -> list[tuple[str, str]]:
    texts = [(path, command.help or ""), (path, command.short_help or "")]
    if command.callback is not None and command.callback.__doc__:
        texts.append((path, command.callback.__doc__))
    texts += [(f"{path} {p.opts[0]}", getattr(p, "help", "") or "") for p in command.params]
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            texts += _texts(sub, f"{path} {name}")
    return texts


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    anchors = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add("#" + re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def test_every_page_and_section_a_help_text_names_exists():
    named = 0
    for where, text in _texts(main):
        assert "README table" not in text and "README '" not in text, where
        for match in PAGE.finditer(text):
            page = match.group(1)
            path = ROOT / (
                page if page.startswith("docs/") or page == "README.md" else f"docs/{page}"
            )
            assert path.is_file(), f"{where} names {page}, which does not exist"
            if match.group(2):
                assert match.group(2) in _anchors(path), f"{where}: no {match.group(2)} in {page}"
            named += 1
    assert named >= 3  # the commands do point at pages (docs/reference/patching.md, ...)


#: A Python name (``graft.remote.hosted.GraftPairModel``, ``benchmarks.paper_table``), a
#: file of the repository (``graft/resources/relations/movies*.toml``) or a command
#: (``graft-exp finetune``, ``graft-exp study status``) that a help text names.
CODE = re.compile(
    r"\b(?P<name>(?:graft|graft_experiments|benchmarks)(?:\.\w+)+)"
    r"|\b(?P<path>(?:graft|benchmarks|scripts)/[\w/.*-]+\w)"
    r"|\bgraft-exp (?P<command>[a-z]+(?: [a-z]+)?)"
)


def _code_problems(where: str, text: str) -> tuple[int, list[str]]:
    named, problems = 0, []
    for match in CODE.finditer(text):
        named += 1
        if match["name"] and not python_name_resolves(match["name"]):
            problems.append(f"{where} names {match['name']}, which does not exist")
        if match["path"] and not list(ROOT.glob(match["path"])):
            problems.append(f"{where} names {match['path']}, which matches no file")
        if match["command"]:
            words = match["command"].split()
            group = main.commands.get(words[0])
            sub = isinstance(group, click.Group) and len(words) > 1
            if group is None or (sub and words[1] not in group.commands):
                problems.append(f"{where} names graft-exp {match['command']}, no such command")
    return named, problems


def test_every_module_file_and_command_a_help_text_names_exists():
    named, problems = 0, []
    for where, text in _texts(main):
        n, found = _code_problems(where, text)
        named, problems = named + n, problems + found
    assert named >= 5  # graft.remote.hosted.GraftPairModel, graft-exp finetune, ...
    assert not problems, "\n".join(problems)


def test_a_help_text_naming_what_left_is_caught():
    text = (
        "see graft.remote.hosted.NoSuchModel, graft/resources/relations/gone*.toml and "
        "graft-exp nosuch, graft-exp study nosuch; graft.remote.hosted.GraftPairModel is here"
    )
    named, problems = _code_problems("x", text)
    assert named == 5 and len(problems) == 4, problems
