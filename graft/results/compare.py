"""Paired comparisons of a run's grafts: the key contrasts every run writes
(``contrasts.parquet`` / ``.csv``, :func:`key_contrasts`) and one pair on demand
(:func:`compare_run`, the ``graft-exp compare`` command).

Every graft of a run scores the same test prompts, so two grafts are compared prompt by
prompt (:func:`graft.results.stats.paired_contrasts`): the exact McNemar test and Newcombe's
paired interval for the top-k accuracy; for a continuous score such as the target's
log-probability a paired bootstrap interval and the Wilcoxon signed-rank p-value.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import polars as pl

from graft.errors import ExperimentError, RunFolderError
from graft.results.record import read_run_record
from graft.results.run_config import recorded_options, recorded_run_key
from graft.results.run_tables import (
    CONTRASTS_STEM,
    NAME_CONTRASTS_STEM,
    refresh_mirrors,
    refuse_special_files,
)
from graft.results.stats import paired_contrasts
from graft.storage.tables import read_table

__all__ = [
    "CONTRASTS_STEM",
    "NAME_CONTRASTS_STEM",
    "CONTROL_SUFFIX",
    "KEY_CONTRASTS",
    "compare_run",
    "control_name",
    "format_comparison",
    "key_contrasts",
    "read_examples",
]

#: The paper's key contrasts ``(A, B)``, A minus B: does grafting FE+LT recover the
#: finetuned model (E1); does FE or LT alone do anything (E1); does O matter beside the FFN,
#: and does attention matter beside O+FFN (E3, component sets at the last token); does the
#: task model's attention or FFN at FE add to the hybrid at LT (E4).
KEY_CONTRASTS: tuple[tuple[str, str], ...] = (
    ("FE+LT", "SFT"),
    ("FE", "PRE"),
    ("LT", "PRE"),
    ("O+FFN", "FFN"),
    ("ATTN+O+FFN", "O+FFN"),
    # E4 (graft.study's hybrid grafts): the task model's attention, or its FFN, at FE
    # against no FE graft, the paper's Fig. 5 comparisons
    ("FE ATTN + LT hybrid", "FE none + LT hybrid"),
    ("FE FFN + LT hybrid", "FE none + LT hybrid"),
)
EXAMPLES_FILE = "examples.parquet"
#: One prompt within a (group, template) cell of a run's examples table.
EXAMPLE_KEY = ("prompt_id",)
#: What a control graft's name adds to the graft it twins: the same graft run with a control
#: donor (finetuned the same way on other facts of the same kind).
CONTROL_SUFFIX = " [control]"


def control_name(name: str) -> str:
    """The name of ``name``'s control twin: ``FE+LT`` -> ``FE+LT [control]``."""
    return name + CONTROL_SUFFIX


def control_pairs(
    present: Sequence[str], pairs: Sequence[tuple[str, str]] = KEY_CONTRASTS
) -> list[tuple[str, str]]:
    """``(graft, its control twin)`` for every graft named in ``pairs`` whose twin is in
    ``present``: did the real donor do better than one that learned other facts?"""
    names = dict.fromkeys(g for pair in pairs for g in pair)
    have = set(present)
    return [(g, control_name(g)) for g in names if g in have and control_name(g) in have]


def replicate_column(examples: pl.DataFrame) -> tuple[pl.DataFrame, str | None]:
    """``examples`` and the column naming its replicates (donors) for a clustered contrast,
    or None when it holds one replicate (runs without seed columns included).

    The column is ``finetune_seed`` when only finetune seeds vary, else an added
    ``replicate`` column (``d<data seed>-f<finetune seed>``): one donor per value.
    """
    cols = [c for c in ("data_seed", "finetune_seed") if c in examples.columns]
    if not cols or examples.select(cols).unique().height <= 1:
        return examples, None
    if cols == ["finetune_seed"] or examples["data_seed"].n_unique() == 1:
        return examples, "finetune_seed"
    label = pl.format("d{}-f{}", pl.col("data_seed"), pl.col("finetune_seed"))
    return examples.with_columns(label.alias("replicate")), "replicate"


def key_contrasts(
    examples: pl.DataFrame,
    hit: str = "hit@5",
    score: str = "target_logprob",
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
    pairs: Sequence[tuple[str, str]] = KEY_CONTRASTS,
) -> pl.DataFrame:
    """The ``pairs`` whose two grafts the run has, plus each of their grafts against its
    control twin (:func:`control_pairs`), per group and template, Holm-adjusted over the
    whole table (one family per test: McNemar, and the ``score`` bootstrap). A run of
    several replicates is compared clustered by replicate (:func:`replicate_column`).

    Args:
        examples: a run's ``examples.parquet`` (columns ``graft``, ``group``, ``template``,
            ``prompt_id``, ``hit``, ``score``).
        hit: boolean hit column compared with McNemar's test.
        score: continuous column compared with the paired bootstrap.
        n_boot: bootstrap resamples.
        seed: bootstrap seed.
        level: coverage of the intervals.
        pairs: ``(A, B)`` graft names; pairs with a graft the run lacks are left out.

    Returns:
        The table of :func:`graft.results.stats.paired_contrasts` (empty when no pair is
        present).
    """
    present = set(examples["graft"].unique().to_list()) if "graft" in examples.columns else set()
    wanted = [(a, b) for a, b in pairs if a in present and b in present]
    wanted += control_pairs(sorted(present), pairs)
    if not wanted:
        return pl.DataFrame()
    return _paired(examples, wanted, hit, score, level, n_boot, seed)


def _paired(
    examples: pl.DataFrame,
    pairs: Sequence[tuple[str, str]],
    hit: str,
    score: str,
    level: float,
    n_boot: int,
    seed: int,
) -> pl.DataFrame:
    """:func:`paired_contrasts` of ``pairs`` matched on the example key, clustered by replicate
    when the run has several (:func:`replicate_column`)."""
    examples, seed_col = replicate_column(examples)
    return paired_contrasts(
        examples,
        pairs,
        hit=hit,
        score=score,
        example_key=EXAMPLE_KEY,
        seed_col=seed_col,
        level=level,
        n_boot=n_boot,
        seed=seed,
    )


def read_examples(folder: str | Path) -> pl.DataFrame:
    """The per-example table of the finished run in ``folder``.

    A component run with several donor pairs keeps each pair's examples in a sub-folder
    (its ``config.json`` lists them under ``pairs``); they are read together.

    Raises:
        RunFolderError: ``folder`` holds no finished run.
        DamagedFileError: its ``config.json`` or an ``examples.parquet`` is damaged (or
            does not match its digest).
    """
    folder = Path(folder)
    refuse_special_files(folder)
    config_file = folder / "config.json"
    record = read_run_record(config_file) if config_file.is_file() else None
    files = [folder / s / EXAMPLES_FILE for s in record.pairs] if record else []
    if record is not None and (folder / EXAMPLES_FILE).is_file():
        files = [folder / EXAMPLES_FILE]
    if not files or not all(f.is_file() for f in files):
        raise RunFolderError(
            f"{folder} is not a finished run folder (needs config.json and {EXAMPLES_FILE}); "
            "give the output folder of a completed experiment"
        )
    name = EXAMPLES_FILE.removesuffix(".parquet")
    marks = {f: (recorded_run_key(f.parent), recorded_options(f.parent)) for f in files}
    tables = [read_table(f, name, key, options=opts) for f, (key, opts) in marks.items()]
    for f, (key, opts) in marks.items():  # what a person opens beside the tables too
        refresh_mirrors(f.parent, key, opts)
    examples = pl.concat(tables, how="diagonal_relaxed")
    if examples.is_empty() or "graft" not in examples.columns:
        raise RunFolderError(f"{folder} holds no scored examples; rerun its experiment")
    return examples


def _hit_column(examples: pl.DataFrame, metric: str) -> str:
    """``hit@k`` for ``metric`` given as ``acc@k`` or ``hit@k`` (or ``name_exact`` in a run
    that scored whole names); raise unless the run has it."""
    hit = "hit" + metric[len("acc") :] if metric.startswith("acc@") else metric
    hits = [c for c in examples.columns if c.startswith("hit@") or c == "name_exact"]
    if hit not in hits:
        accs = ", ".join("acc" + h[len("hit") :] if h.startswith("hit") else h for h in hits)
        raise ExperimentError(
            f"metric {metric!r} is not an accuracy of this run; use one of {accs} "
            "(a rank, probability or log-prob is compared as the score)"
        )
    return hit


def _score_column(examples: pl.DataFrame, score: str) -> str:
    """``score`` after checking it is a numeric per-example column of the run."""
    numeric = [
        c
        for c, dtype in examples.schema.items()
        if (c.startswith("target_") and c != "target_id" or c == "name_logprob")
        and dtype.is_numeric()
    ]
    if score not in numeric:
        raise ExperimentError(f"unknown score {score!r}; use one of {', '.join(numeric)}")
    return score


def _check_grafts(examples: pl.DataFrame, a: str, b: str) -> None:
    names = list(dict.fromkeys(examples["graft"].to_list()))
    unknown = [g for g in dict.fromkeys((a, b)) if g not in names]
    if unknown:
        what = "graft" if len(unknown) == 1 else "grafts"
        raise ExperimentError(
            f"{what} {', '.join(map(repr, unknown))} not in this run; its grafts are "
            f"{', '.join(names)}"
        )
    if a == b:
        raise ExperimentError(f"compare two different grafts, got {a!r} twice")


def compare_run(
    folder: str | Path,
    a: str,
    b: str,
    metric: str = "acc@5",
    score: str = "target_logprob",
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> pl.DataFrame:
    """Graft ``a`` against graft ``b`` in the finished run in ``folder``, per group and
    template, on the prompts both scored (Holm-adjusted over the templates). In a run of
    several replicates the prompts are matched within each replicate and the intervals and
    the intervals come from a bootstrap clustered by replicate and the score's p-value from
    the signed-rank test of the prompts' mean differences over replicates.

    Args:
        folder: a run folder (``config.json`` and ``examples.parquet``).
        a: graft name (as in the run's tables, e.g. ``FE+LT``).
        b: graft name; differences are ``a`` minus ``b``.
        metric: the accuracy compared with McNemar's test: ``acc@k`` (or ``hit@k``), or
            ``name_exact`` (greedy continuation is the whole target name) in a run that
            scored whole names.
        score: continuous per-example column compared (bootstrap interval, signed-rank p)
            (``target_logprob``, ``target_rank``, ``target_prob``; ``name_logprob``, the
            whole name's teacher-forced log-prob, in a run that scored whole names).
        n_boot: bootstrap resamples.
        seed: bootstrap seed.
        level: coverage of the intervals.

    Returns:
        The :func:`graft.results.stats.paired_contrasts` table of the pair.

    Raises:
        RunFolderError: ``folder`` holds no finished run.
        ExperimentError: an unknown graft, metric or score, or no template where both
            grafts ran.
    """
    examples = read_examples(folder)
    _check_grafts(examples, a, b)
    hit, score = _hit_column(examples, metric), _score_column(examples, score)
    table = _paired(examples, [(a, b)], hit, score, level, n_boot, seed)
    if table.is_empty():
        raise ExperimentError(f"{a!r} and {b!r} never ran on the same template and group")
    return table


#: The ``interval`` column of a contrasts table -> how the report names the accuracy's and
#: the score's intervals.
_INTERVAL_NAMES = {
    "newcombe": ("Newcombe paired", "paired bootstrap"),
    "cluster-bootstrap": (
        "cluster-bootstrap (replicates, then prompts)",
        "cluster bootstrap over replicates, then prompts",
    ),
}


def _interval(value: float, lo: float, hi: float, digits: int) -> str:
    return f"{value:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


def format_comparison(table: pl.DataFrame, level: float = 0.95) -> str:
    """A readable report of a :func:`compare_run` table: one block per template (and group)."""
    # the accuracy's columns come before the score's (see paired_contrasts)
    acc, score = [c[: -len("_diff")] for c in table.columns if c.endswith("_diff")][:2]
    pct = f"{100 * level:g}%"
    lines = []
    for row in table.iter_rows(named=True):
        a, b = row["graft_a"], row["graft_b"]
        cell = row.get("template", "all")
        if row.get("group"):
            cell = f"{cell} [{row['group']}]"
        acc_ci, score_ci = _INTERVAL_NAMES.get(row["interval"], (row["interval"],) * 2)
        n_seeds = row.get("n_seeds") or 1
        what = "prompts" if n_seeds == 1 else f"(prompt, replicate) pairs over {n_seeds} replicates"
        lines += [
            f"{cell}: {a} vs {b}, n={row['n']} {what}",
            f"  {acc}: {a} {row[f'{acc}_a']:.3f}, {b} {row[f'{acc}_b']:.3f}; difference "
            f"{_interval(row[f'{acc}_diff'], row[f'{acc}_diff_lo'], row[f'{acc}_diff_hi'], 3)}"
            f" ({pct} {acc_ci} interval)",
            f"  McNemar: b={row['mcnemar_b']} ({a} only), c={row['mcnemar_c']} ({b} only), "
            f"exact p={row['mcnemar_p']:.3g} (Holm {row['mcnemar_p_holm']:.3g})",
            f"  {score}: {a} {row[f'{score}_a']:.3f}, {b} {row[f'{score}_b']:.3f}; difference "
            f"{_interval(row[f'{score}_diff'], row[f'{score}_diff_lo'], row[f'{score}_diff_hi'], 3)}"
            f" ({pct} {score_ci}), p={row[f'{score}_p']:.3g} "
            f"({row.get(f'{score}_test') or 'bootstrap'}, Holm {row[f'{score}_p_holm']:.3g})",
        ]
    return "\n".join(lines)
