"""Every page a command's help or docstring names exists, and every section it names is a
heading there: help that points at documentation cannot point at nothing."""

from __future__ import annotations

import re
from pathlib import Path

import click

from graft_experiments.cli import main

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
