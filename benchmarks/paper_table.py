"""Print the README's results table: each number the paper states beside graft's, with a
verdict (agrees / **disagrees** / undecided), the tests and the reason
(graft.results.paper.agreement; the rules in graft.results.stats.agreement), under a caption that
states the rules.

Run from the repository root::

    python -m benchmarks.paper_table [--margin 0.10] "LABEL=MODEL=FOLDER" ["LABEL=MODEL=FOLDER" ...]

FOLDER holds ``<experiment>_summary.csv`` and ``<experiment>_contrasts.csv`` (as under
``results/``) or is a run folder; MODEL is graft's model name (``smollm2-135m``,
``gemma3-270m``), which decides the paper model a run is compared with. A paper number no
run tests gets one "not run" row (the "≈" statements only for paper models some run
stands for).
"""

from __future__ import annotations

import shlex
import sys
from collections import Counter
from collections.abc import Sequence

from graft.results import (
    ALPHA,
    MARGIN,
    PAPER_NUMBERS,
    Check,
    PaperNumber,
    check_run,
    paper_model_of,
    read_results,
    reason_text,
    rules_summary,
    rules_text,
    short_text,
    test_text,
)

HEADER = (
    "| paper's finding (headline prompts, acc@5) | paper | run | graft | verdict (test): reason |\n"
    "|---|---|---|---|---|"
)
SHORT_HEADER = HEADER.replace("verdict (test): reason", "verdict: what decided it")
USAGE = 'usage: python -m benchmarks.paper_table [--margin 0.10] "LABEL=MODEL=FOLDER" ...'


def finding(number: PaperNumber) -> str:
    """The paper's claim in a few words: ``Fig. 2: LT``, ``Fig. 4: O+FFN − FFN``."""
    source = number.source.split(",")[0].removesuffix(" caption")
    what = {
        "value": number.graft,
        "difference": f"{number.graft} − {number.versus}",
        "approx": f"{number.graft} ≈ {number.versus}",
    }[number.kind]
    return f"{source}: {what}"


def paper_cell(number: PaperNumber) -> str:
    """The paper's value and model: ``0.53 (paper: Gemma-1.1-2B)``."""
    where = f"paper: {number.paper_model}"
    if number.group:
        where += f", {number.group} pair"
    if number.kind == "approx":
        return f"≈ ({where})"
    value = f"{number.value:+.2f}" if number.kind == "difference" else f"{number.value:.2f}"
    return f"{value} ({where})"


def verdict(check: Check, short: bool = False) -> str:
    """The verdict cell: ``**disagrees** (test): reason; note``; ``short``: the verdict and
    its deciding numbers alone (``undecided: both at the floor (0/150, 0/150) ...``)."""
    agreement = check.agreement
    if agreement is None:
        return check.note or "not tested"
    word = "**disagrees**" if agreement.verdict == "disagrees" else agreement.verdict
    if short:
        return f"{word}: {short_text(agreement)}"
    text = f"{word} ({test_text(agreement)}): {reason_text(agreement)}"
    return text + (f"; {check.note}" if check.note else "")


Run = tuple[str, str, str]


def checks_of(
    runs: Sequence[Run], alpha: float = ALPHA, margin: float = MARGIN
) -> tuple[list[Check], set[str | None]]:
    """Every paper number tested on each ``(label, model, folder)`` run, and the paper
    models the runs stand for."""
    results = [read_results(folder, model, label) for label, model, folder in runs]
    checks = [c for run in results for c in check_run(run, alpha, margin)]
    return checks, {paper_model_of(run.model) for run in results}


def table(
    runs: Sequence[Run],
    alpha: float = ALPHA,
    margin: float = MARGIN,
    others: bool = True,
    short: bool = False,
) -> str:
    """The markdown table for ``(label, model, folder)`` runs; without ``others``, rows on
    another quantity than the paper's (another donor pair: no verdict) are left out, so the
    table compares like with like (a number left without a row says so); ``short``: each
    verdict with its deciding numbers only (:func:`verdict`)."""
    checks, compared = checks_of(runs, alpha, margin)
    lines = [SHORT_HEADER if short else HEADER]
    for number in PAPER_NUMBERS:
        mine = [c for c in checks if c.number == number]
        if not others:
            mine = [c for c in mine if c.agreement is not None or not c.note]
        if not mine:
            if number.kind != "approx" or number.paper_model in compared:
                pair = f" on the {number.group} pair" if number.group else ""
                lines.append(
                    f"| {finding(number)} | {paper_cell(number)} | — | no committed run{pair} | — |"
                )
            continue
        for check in mine:
            lines.append(
                f"| {finding(number)} | {paper_cell(number)} | {check.run} | {check.graft} "
                f"| {verdict(check, short)} |"
            )
    return "\n".join(lines)


def tally(checks: Sequence[Check]) -> dict[str, int]:
    """How many checks agree, disagree and are undecided (untested ones not counted)."""
    counts = Counter(c.agreement.verdict for c in checks if c.agreement is not None)
    return {v: counts.get(v, 0) for v in ("agrees", "disagrees", "undecided")}


def command(runs: Sequence[Run], margin: float = MARGIN) -> str:
    """The command line that prints the table for ``runs``."""
    words = ["python", "-m", "benchmarks.paper_table"]
    if margin != MARGIN:
        words += ["--margin", f"{margin:g}"]
    return shlex.join(words + ["=".join(run) for run in runs])


def caption(runs: Sequence[Run] = (), alpha: float = ALPHA, margin: float = MARGIN) -> str:
    """The table's caption: the rules in words (:func:`rules_text`), then, given ``runs``,
    the command that made the table."""
    text = (
        "The paper's numbers (only those its text states) against each run "
        f"(`graft/results/stats/agreement.py`). {rules_text(alpha, margin)}"
    )
    if runs:
        text += f" Made by `{command(runs, margin)}`:"
    return text


def markdown(
    runs: Sequence[Run],
    alpha: float = ALPHA,
    margin: float = MARGIN,
    with_command: bool = True,
    others: bool = True,
    short: bool = False,
) -> str:
    """The caption, a blank line and the table: the README's block for ``runs`` (the
    caption names the command when ``with_command``; ``others``: :func:`table`'s;
    ``short``: the rules in two sentences and short verdict cells)."""
    if short:
        head = rules_summary(alpha, margin)
    else:
        head = caption(runs if with_command else (), alpha, margin)
    return f"{head}\n\n{table(runs, alpha, margin, others, short)}"


def paper_table_markdown(
    runs: Sequence[Run], margin: float | None = None, others: bool = True, short: bool = False
) -> str:
    """The rules and the table for ``runs`` at ``margin`` (None: :data:`MARGIN`), for a
    command that writes it into a document (benchmarks.results_tables, which names its own
    command and passes absolute folders: the caption names none); ``others=False`` leaves
    out the rows on another quantity than the paper's; ``short``: :func:`markdown`'s."""
    margin = MARGIN if margin is None else margin
    return markdown(runs, margin=margin, with_command=False, others=others, short=short)


def _parse(argv: list[str]) -> tuple[list[Run], float] | None:
    """Runs and margin from the command line; None on a usage error."""
    margin, rest = MARGIN, list(argv)
    if rest and rest[0].startswith("--margin"):
        flag = rest.pop(0)
        value = flag.partition("=")[2] if "=" in flag else (rest.pop(0) if rest else "")
        try:
            margin = float(value)
        except ValueError:
            return None
        if not 0 < margin < 1:
            return None
    if not rest or any(a.count("=") < 2 for a in rest):
        return None
    runs = [a.split("=", 2) for a in rest]
    return [(r[0], r[1], r[2]) for r in runs], margin


def main(argv: list[str]) -> int:
    parsed = _parse(argv)
    if parsed is None:
        print(USAGE, file=sys.stderr)
        print("  --margin: the equivalence margin δ on acc@5, in (0, 1)", file=sys.stderr)
        return 2
    runs, margin = parsed
    print(markdown(runs, margin=margin))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
