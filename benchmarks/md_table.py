"""Markdown tables as the table makers write them: the header row, the rule under it, then a
row of cells per record."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def escaped(text: str) -> str:
    """``text`` as one cell: its ``|`` escaped, so that it does not split the cell."""
    return text.replace("|", "\\|")


def md_row(cells: Iterable[str]) -> str:
    """One row of a markdown table: ``| a | b | c |``."""
    return "| " + " | ".join(cells) + " |"


def md_table(head: Sequence[str], body: Iterable[Iterable[str]], right: int = 0) -> str:
    """The markdown table of the columns ``head``, its last ``right`` columns right-aligned,
    with a row per item of ``body`` (that row's cells)."""
    rule = "|" + "---|" * (len(head) - right) + "---:|" * right
    return "\n".join([md_row(head), rule, *(md_row(cells) for cells in body)])
