"""graft's results against the numbers the paper states: read a run's saved summaries and
contrasts, and test each paper number that applies to the run's model (rules in
:mod:`graft.results.stats.agreement` and :mod:`graft.results.stats.paired_agreement`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import polars as pl

from graft.errors import ResultsError
from graft.results.paper import numbers as paper_numbers
from graft.results.paper.numbers import PaperNumber
from graft.results.record import read_run_record
from graft.results.stats.agreement import binomial_agreement, interval_agreement, seeds_agreement
from graft.results.stats.intervals import paired_interval
from graft.results.stats.paired import holm, mcnemar_exact_p, over_seeds_p
from graft.results.stats.paired_agreement import (
    floor_or_ceiling,
    guarded,
    mcnemar_agreement,
    mcnemar_p_range,
    mcnemar_range_agreement,
)
from graft.results.stats.verdict import ALPHA, MARGIN, Agreement

logger = logging.getLogger(__name__)

__all__ = [
    "Check",
    "RunResults",
    "check_number",
    "check_run",
    "read_csv_table",
    "read_results",
    "two_sided_p",
]

METRIC = "acc@5"
_INTERVAL_NAMES = {"newcombe": "Newcombe interval", "cluster-bootstrap": "cluster bootstrap"}


@dataclass(frozen=True)
class RunResults:
    """The saved tables of one run (or of several experiments run alike).

    Args:
        label: the run's name in a table.
        model: graft's model name (which paper model it is compared with).
        summaries: experiment -> its summary table.
        contrasts: experiment -> its table of paired contrasts.
    """

    label: str
    model: str
    summaries: dict[str, pl.DataFrame] = field(default_factory=dict)
    contrasts: dict[str, pl.DataFrame] = field(default_factory=dict)


@dataclass(frozen=True)
class Check:
    """One paper number tested on one run.

    Args:
        number: the paper's number.
        run: the run's label.
        graft: graft's side, in words (value and interval, or the two grafts).
        agreement: the verdict; None where the run has no result to test.
        note: what differs between the paper's setting and graft's, if anything.
    """

    number: PaperNumber
    run: str
    graft: str
    agreement: Agreement | None
    note: str = ""


def read_csv_table(path: str | Path) -> pl.DataFrame:
    """A summary or contrasts CSV as graft wrote it: per-replicate columns back to lists, an
    empty group as ``""``."""
    frame = pl.read_csv(path, infer_schema_length=None)
    lists = [c for c in frame.columns if c.endswith("_per_seed")]
    frame = frame.with_columns(
        pl.col(c).cast(pl.Utf8).str.json_decode(pl.List(pl.Float64)) for c in lists
    )
    return (
        frame.with_columns(pl.col("group").cast(pl.Utf8).fill_null(""))
        if ("group" in frame.columns)
        else frame
    )


def read_results(folder: str | Path, model: str | None = None, label: str = "") -> RunResults:
    """A run's tables from ``folder``: ``<experiment>_summary.csv`` and
    ``<experiment>_contrasts.csv`` (the layout of ``results/``), or a run folder's
    ``summary.csv`` and ``contrasts.csv`` with the experiment and model read from its
    ``config.json``.

    Raises:
        ResultsError: no summary in ``folder``, or no model named for a ``results/`` folder.
    """
    folder = Path(folder)
    summaries, contrasts = {}, {}
    if (folder / "config.json").is_file() and (folder / "summary.csv").is_file():
        record = read_run_record(folder)
        experiment = record.experiment
        model = model or str(record.options.get("model") or "")
        summaries[experiment] = read_csv_table(folder / "summary.csv")
        if (folder / "contrasts.csv").is_file():
            contrasts[experiment] = read_csv_table(folder / "contrasts.csv")
    for path in sorted(folder.glob("*_summary.csv")):
        summaries[path.name.removesuffix("_summary.csv")] = read_csv_table(path)
    for path in sorted(folder.glob("*_contrasts.csv")):
        contrasts[path.name.removesuffix("_contrasts.csv")] = read_csv_table(path)
    if not summaries:
        raise ResultsError(f"no summary in {folder}; give a run folder or a results/ folder")
    if not model:
        raise ResultsError(f"which model ran {folder}? name it (e.g. gemma3-270m)")
    return RunResults(label or folder.name, model, summaries, contrasts)


def _cell_rows(frame: pl.DataFrame, graft: str, template: str, group: str) -> pl.DataFrame:
    return frame.filter(
        (pl.col("graft") == graft) & (pl.col("template") == template) & (pl.col("group") == group)
    )


def _mean_row(rows: pl.DataFrame) -> dict | None:
    """The row a run reports: the mean over replicates where it has several, else its one."""
    if "n_seeds" in rows.columns and (rows["n_seeds"] > 1).any():
        rows = rows.filter(pl.col("n_seeds") > 1)
    return rows.row(0, named=True) if rows.height else None


def _hits(rows: pl.DataFrame) -> tuple[int, int]:
    """Hits and prompts pooled over a graft's replicates (the per-replicate rows; the mean
    row's n per replicate times its replicates where a table has no others)."""
    if "n_seeds" in rows.columns:
        single = rows.filter(pl.col("n_seeds").fill_null(1) == 1)
        if single.is_empty():
            row = rows.row(0, named=True)
            n = int(row["n"]) * int(row["n_seeds"])
            return int(round(row[METRIC] * n)), n
        rows = single
    k = sum(round(a * n) for a, n in zip(rows[METRIC], rows["n"], strict=True))
    return int(k), int(rows["n"].sum())


def _per_seed(row: dict) -> list[float] | None:
    """A mean row's per-replicate values (None: one replicate, or a table without them)."""
    values = row.get(f"{METRIC}_per_seed")
    if (row.get("n_seeds") or 1) < 2 or not values:
        return None
    return [float(v) for v in values]


def _seed_diffs(summary: pl.DataFrame, a: str, b: str, template: str, group: str) -> list | None:
    """Per-replicate differences A − B from the summary's mean rows (None where either has
    none, or they list different replicates)."""
    row_a = _mean_row(_cell_rows(summary, a, template, group))
    row_b = _mean_row(_cell_rows(summary, b, template, group))
    if row_a is None or row_b is None:
        return None
    va, vb = _per_seed(row_a), _per_seed(row_b)
    if va is None or vb is None or row_a.get("per_seed_of") != row_b.get("per_seed_of"):
        return None
    return [x - y for x, y in zip(va, vb, strict=True)]


def _check_value(
    number: PaperNumber, summary: pl.DataFrame, alpha: float, margin: float
) -> tuple[str, Agreement | None]:
    rows = _cell_rows(summary, number.graft, number.template, number.group)
    row = _mean_row(rows)
    if row is None or number.value is None:
        return f"{number.graft}: not in this run", None
    lo, hi, value = row[f"{METRIC}_lo"], row[f"{METRIC}_hi"], row[METRIC]
    text = f"{number.graft} {value:.2f} [{lo:.2f}, {hi:.2f}]"
    if (row.get("n_seeds") or 1) > 1:
        values = _per_seed(row)
        if values is None:  # an older table: its 95% interval stands in for the 90% one
            name = f"interval over {row['n_seeds']} seeds"
            verdict = interval_agreement(
                number.value, (lo, hi), (lo, hi), name, alpha, margin, signed=False
            )
            return text, verdict
        k, n = _hits(rows)
        return text, seeds_agreement(values, k, n, number.value, alpha, margin)
    return text, binomial_agreement(round(value * row["n"]), row["n"], number.value, alpha, margin)


def _contrast(
    contrasts: pl.DataFrame | None, a: str, b: str, template: str, group: str
) -> tuple[dict | None, str]:
    """The run's contrast ``a`` vs ``b`` (either order, made A vs B), of ``group`` if it has
    one, else of another group (named in the second value)."""
    if contrasts is None:
        return None, ""
    rows = contrasts.filter(
        (pl.col("template") == template)
        & (
            ((pl.col("graft_a") == a) & (pl.col("graft_b") == b))
            | ((pl.col("graft_a") == b) & (pl.col("graft_b") == a))
        )
    )
    if rows.is_empty():
        return None, ""
    same = rows.filter(pl.col("group") == group)
    row = (same if same.height else rows).row(0, named=True)
    if row["graft_a"] != a:  # flip B vs A into A vs B
        row = {
            **row,
            "graft_a": row["graft_b"],
            "graft_b": row["graft_a"],
            f"{METRIC}_a": row[f"{METRIC}_b"],
            f"{METRIC}_b": row[f"{METRIC}_a"],
            f"{METRIC}_diff": -row[f"{METRIC}_diff"],
            f"{METRIC}_diff_lo": -row[f"{METRIC}_diff_hi"],
            f"{METRIC}_diff_hi": -row[f"{METRIC}_diff_lo"],
            "mcnemar_b": row.get("mcnemar_c"),
            "mcnemar_c": row.get("mcnemar_b"),
        }
    return row, "" if same.height else str(row["group"])


def _cells(row: dict) -> tuple[int, int, int, int]:
    """The pooled paired table (both hit, only A, only B, neither) of a contrast row: its
    discordant counts, its n and A's and B's accuracies.

    Raises:
        ResultsError: the row lacks the counts or they do not make a table.
    """
    if row.get("mcnemar_b") is None or row.get("mcnemar_c") is None:
        raise ResultsError(
            f"contrast {row['graft_a']} vs {row['graft_b']} has no mcnemar_b/mcnemar_c counts"
        )
    n, b, c = int(row["n"]), int(row["mcnemar_b"]), int(row["mcnemar_c"])
    k_a, k_b = round(row[f"{METRIC}_a"] * n), round(row[f"{METRIC}_b"] * n)
    both = k_a - b
    if both < 0 or k_b - c != both or n - both - b - c < 0:
        raise ResultsError(
            f"contrast {row['graft_a']} vs {row['graft_b']}: {k_a} and {k_b} hits of {n} with "
            f"{b} and {c} discordant do not make a paired table"
        )
    return both, b, c, n - both - b - c


def _setting_note(number: PaperNumber, other_group: str) -> str:
    if not other_group:
        return ""
    return (
        f"no verdict: another quantity (graft's {other_group} pair; the paper's number is on "
        f"the {number.group or 'SFT'} pair)"
    )


def _check_difference(
    number: PaperNumber,
    row: dict,
    summary: pl.DataFrame,
    alpha: float,
    margin: float,
    adjust: Callable[[float], float],
) -> tuple[str, Agreement]:
    """The paper's difference against the contrast's paired interval (Newcombe on the
    pooled table, widened over seeds to the t interval and, at 95%, the run's own), under
    the floor and ceiling guard of "≈": where both grafts recover nothing (or everything)
    their difference is no measure of the paper's, unless the run's McNemar test finds
    that they differ."""
    assert number.value is not None
    cells = _cells(row)
    both, b, c, _ = cells
    floor = floor_or_ceiling(both + b, both + c, int(row["n"]), margin)
    diffs = _seed_diffs(summary, number.graft, number.versus, number.template, str(row["group"]))
    ours = paired_interval(cells, 1 - alpha, diffs)
    lo = min(ours.lo, row[f"{METRIC}_diff_lo"])
    hi = max(ours.hi, row[f"{METRIC}_diff_hi"])
    tost = paired_interval(cells, 1 - 2 * alpha, diffs)
    own = _INTERVAL_NAMES.get(str(row.get("interval")), "interval")
    name = "interval" if diffs is None else f"interval over {len(diffs)} seeds"
    verdict = interval_agreement(number.value, (lo, hi), tost, name, alpha, margin)
    seeds = len(diffs) if diffs else 1
    verdict = replace(verdict, widened_to=own, two_sided=replace(verdict.two_sided, seeds=seeds))
    p = adjust(_contrast_p(number, row, summary))
    verdict = guarded(floor, p < alpha, verdict)
    return f"{row[f'{METRIC}_diff']:+.2f} [{lo:+.2f}, {hi:+.2f}]", verdict


def _contrast_p(number: PaperNumber, row: dict, summary: pl.DataFrame) -> float:
    """The two-sided p of a contrast row before any family's adjustment: its exact McNemar
    p, over seeds the larger of it and the seed-level t test."""
    _, b, c, _ = _cells(row)
    diffs = _seed_diffs(summary, number.graft, number.versus, number.template, row["group"])
    return over_seeds_p(mcnemar_exact_p(b, c), diffs)


def two_sided_p(number: PaperNumber, run: RunResults) -> float | None:
    """The two-sided p of A against B that the verdict on ``number`` reads, before its
    family's adjustment: the exact McNemar p of the run's paired table (without one, the
    largest over the pairings the hit counts allow), over seeds the larger of it and the
    seed-level t test (:func:`~graft.results.stats.paired.over_seeds_p`). None for a value,
    a claim the run lacks, or one on another donor pair (no verdict)."""
    summary = run.summaries.get(number.experiment)
    if number.kind == "value" or summary is None:
        return None
    if paper_numbers.paper_model_of(run.model) != number.paper_model:
        return None
    contrasts = run.contrasts.get(number.experiment)
    row, other = _contrast(contrasts, number.graft, number.versus, number.template, number.group)
    if other:
        return None
    if row is not None:
        return _contrast_p(number, row, summary)
    a_rows = _cell_rows(summary, number.graft, number.template, number.group)
    b_rows = _cell_rows(summary, number.versus, number.template, number.group)
    if number.kind == "difference" or a_rows.is_empty() or b_rows.is_empty():
        return None
    (k_a, n_a), (k_b, n_b) = _hits(a_rows), _hits(b_rows)
    if n_a != n_b:
        return None
    diffs = _seed_diffs(summary, number.graft, number.versus, number.template, number.group)
    return over_seeds_p(mcnemar_p_range(k_a, k_b, n_a)[1], diffs)


def check_number(
    number: PaperNumber,
    run: RunResults,
    alpha: float = ALPHA,
    margin: float = MARGIN,
    adjust: Callable[[float], float] | None = None,
    family: str = "",
) -> Check | None:
    """Test ``number`` on ``run`` (significance level ``alpha``, equivalence margin
    ``margin``); None when it is about another paper model or an experiment the run does
    not have. ``adjust`` maps the claim's two-sided p (:func:`two_sided_p`) to its value
    adjusted within ``family`` (the claims tested with it, named in the verdict's test;
    :func:`check_run` passes Holm's); by default the claim stands alone."""
    if paper_numbers.paper_model_of(run.model) != number.paper_model:
        return None
    summary = run.summaries.get(number.experiment)
    if summary is None:
        return None
    adjust = adjust or (lambda p: p)
    contrasts = run.contrasts.get(number.experiment)
    if number.kind == "value":
        text, verdict = _check_value(number, summary, alpha, margin)
        return Check(number, run.label, text, verdict)
    row, other = _contrast(contrasts, number.graft, number.versus, number.template, number.group)
    note = _setting_note(number, other)
    if number.kind == "difference":
        if row is None or number.value is None:
            return Check(number, run.label, "contrast not in this run", None)
        text, verdict = _check_difference(number, row, summary, alpha, margin, adjust)
        # a number of another pair is shown, labelled, and tested against nothing
        return Check(number, run.label, text, None if other else verdict, note)
    if row is not None:
        text = (
            f"{number.graft} {row[f'{METRIC}_a']:.2f} vs {number.versus} {row[f'{METRIC}_b']:.2f}"
        )
        diffs = _seed_diffs(summary, number.graft, number.versus, number.template, row["group"])
        verdict = mcnemar_agreement(
            adjust(_contrast_p(number, row, summary)),
            _cells(row),
            alpha,
            margin,
            seed_diffs=diffs,
            family=family,
        )
        return Check(number, run.label, text, None if other else verdict, note)
    group = number.group
    a_rows = _cell_rows(summary, number.graft, number.template, group)
    b_rows = _cell_rows(summary, number.versus, number.template, group)
    if a_rows.is_empty() or b_rows.is_empty():
        return Check(number, run.label, "grafts not in this run", None)
    (k_a, n_a), (k_b, n_b) = _hits(a_rows), _hits(b_rows)
    if n_a != n_b:
        raise ResultsError(f"{number.graft} and {number.versus} have {n_a} and {n_b} prompts")
    text = f"{number.graft} {k_a}/{n_a} vs {number.versus} {k_b}/{n_b}"
    diffs = _seed_diffs(summary, number.graft, number.versus, number.template, group)
    verdict = mcnemar_range_agreement(
        k_a, k_b, n_a, alpha, margin, seed_diffs=diffs, adjust=adjust, family=family
    )
    return Check(number, run.label, text, verdict, note)


def _holm_within(others: list[float]) -> Callable[[float], float]:
    """p -> its Holm-adjusted value in a family with the fixed p-values ``others``."""
    return lambda p: float(holm([p, *others])[0])


def check_run(run: RunResults, alpha: float = ALPHA, margin: float = MARGIN) -> list[Check]:
    """Every paper number that applies to ``run``, tested. The two-sided tests of A
    against B (the "≈" claims and the floor guard of a difference) are Holm-adjusted within
    the question they answer: the claims of one paper figure on this run (Fig. 2's "FE+LT
    ≈ SFT" and "(FE+LT)^C ≈ PRE" together), whatever other contrasts the run's command
    computed."""
    raw = {n: two_sided_p(n, run) for n in paper_numbers.PAPER_NUMBERS}
    checks = []
    for number in paper_numbers.PAPER_NUMBERS:
        family = [
            m
            for m in paper_numbers.PAPER_NUMBERS
            if m.figure == number.figure and raw[m] is not None
        ]
        if raw[number] is None or len(family) < 2:
            checks.append(check_number(number, run, alpha, margin))
            continue
        others = [float(raw[m]) for m in family if m is not number]  # type: ignore[arg-type]
        name = f"the {len(family)} {number.figure} claims on this run"
        checks.append(check_number(number, run, alpha, margin, _holm_within(others), name))
    return [c for c in checks if c is not None]
