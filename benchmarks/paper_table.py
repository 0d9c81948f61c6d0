"""Print the README's results table: each number the paper states beside graft's, with an
"agrees?" verdict and the test behind it (graft.results.agreement).

Run from the repository root::

    python -m benchmarks.paper_table "LABEL=MODEL=FOLDER" ["LABEL=MODEL=FOLDER" ...]

FOLDER holds ``<experiment>_summary.csv`` and ``<experiment>_contrasts.csv`` (as under
``results/``) or is a run folder; MODEL is graft's model name (``smollm2-135m``,
``gemma3-270m``), which decides the paper model a run is compared with. A paper number no
run tests gets one "not run" row (the "≈" statements only for paper models some run
stands for).
"""

from __future__ import annotations

import sys

from graft.results import paper_numbers
from graft.results.agreement import Check, check_run, read_results
from graft.results.paper_numbers import PaperNumber

HEADER = (
    "| paper's finding (headline prompts, acc@5) | paper | run | graft | agrees? (test) |\n"
    "|---|---|---|---|---|"
)


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


def verdict(check: Check) -> str:
    agreement = check.agreement
    if agreement is None:
        return "not tested"
    word = {True: "yes", False: "**no**", None: "undecided"}[agreement.agrees]
    text = f"{word}: {agreement.detail}"
    return text + (f"; {check.note}" if check.note else "")


def table(runs: list[tuple[str, str, str]]) -> str:
    """The markdown table for ``(label, model, folder)`` runs."""
    results = [read_results(folder, model, label) for label, model, folder in runs]
    checks = [c for run in results for c in check_run(run)]
    compared = {paper_numbers.paper_model_of(run.model) for run in results}
    lines = [HEADER]
    for number in paper_numbers.PAPER_NUMBERS:
        mine = [c for c in checks if c.number == number]
        if not mine:
            if number.kind != "approx" or number.paper_model in compared:
                lines.append(
                    f"| {finding(number)} | {paper_cell(number)} | — | no committed run | — |"
                )
            continue
        for check in mine:
            lines.append(
                f"| {finding(number)} | {paper_cell(number)} | {check.run} | {check.graft} "
                f"| {verdict(check)} |"
            )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or any(a.count("=") < 2 for a in argv):
        print('usage: python -m benchmarks.paper_table "LABEL=MODEL=FOLDER" ...', file=sys.stderr)
        return 2
    runs = [tuple(a.split("=", 2)) for a in argv]
    print(table([(r[0], r[1], r[2]) for r in runs]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
