"""A run's table of paired contrasts "graft A vs graft B", one row per (cell, pair), with
Holm-adjusted p-values (:func:`paired_contrasts`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from graft.errors import StatsError
from graft.results.stats.paired import (
    cluster_bootstrap,
    holm,
    paired_bootstrap,
    paired_hits,
    signed_rank_p,
)

#: The test of the continuous score's ``{score}_p``, as the table names it.
SCORE_TEST = "Wilcoxon signed-rank"


def _metric_name(hit: str) -> str:
    """The accuracy's name in the table: ``hit@5`` -> ``acc@5``; ``name_exact`` (whole-name
    exact match) keeps its name."""
    if hit.startswith("hit"):
        return "acc" + hit[len("hit") :]
    return hit if hit == "name_exact" else f"mean_{hit}"


def _pair_frame(
    cell: pl.DataFrame, a: str, b: str, keys: list[str], columns: list[str]
) -> pl.DataFrame:
    """Rows of examples both grafts scored, A's and B's values side by side."""
    left = cell.filter(pl.col("graft") == a).select(*keys, *columns)
    right = cell.filter(pl.col("graft") == b).select(*keys, *columns)
    return left.join(right, on=keys, how="inner", suffix="__b").sort(keys)


def _seed_groups(joined: pl.DataFrame, seed_col: str | None) -> list[np.ndarray]:
    """Row indices of each seed (one group of all rows without ``seed_col``)."""
    if seed_col is None:
        return [np.arange(joined.height)]
    seeds = joined[seed_col].to_numpy()
    return [np.flatnonzero(seeds == s) for s in np.unique(seeds)]


def _contrast_row(
    joined: pl.DataFrame, hit: str, score: str, seed_col: str | None, args: dict[str, Any]
) -> dict[str, Any]:
    """Statistics of one (cell, pair): see :func:`paired_contrasts` for the columns."""
    ha, hb = joined[hit].to_numpy(), joined[f"{hit}__b"].to_numpy()
    sa, sb = joined[score].to_numpy(), joined[f"{score}__b"].to_numpy()
    groups = _seed_groups(joined, seed_col)
    test = paired_hits(ha, hb, args["level"])
    boot_args = (args["n_boot"], args["seed"], args["level"])
    if seed_col is None:
        acc_lo, acc_hi = test.lo, test.hi
        boot = paired_bootstrap(sa, sb, *boot_args)
    else:
        hit_d = ha.astype(np.float64) - hb.astype(np.float64)
        hits = cluster_bootstrap([hit_d[g] for g in groups], *boot_args)
        acc_lo, acc_hi = hits.lo, hits.hi
        boot = cluster_bootstrap([(sa - sb)[g] for g in groups], *boot_args)

    def seed_mean(x: np.ndarray) -> float:
        # Every seed weighs the same, as in cluster_bootstrap.
        return float(np.mean([x[g].mean() for g in groups]))

    # the score's test: over examples, each once (with seeds, the seeds' mean difference of
    # an example: the seeds share their examples, so a pooled test would count each thrice)
    d = sa - sb
    if seed_col is not None:
        keys = args["example_key"]
        per = joined.select(*keys, pl.Series("__d", d)).group_by(keys).agg(pl.col("__d").mean())
        d = per["__d"].to_numpy()
    acc = _metric_name(hit)
    acc_a, acc_b = seed_mean(ha.astype(np.float64)), seed_mean(hb.astype(np.float64))
    return {
        "n": joined.height,
        "n_seeds": len(groups),
        f"{acc}_a": acc_a,
        f"{acc}_b": acc_b,
        f"{acc}_diff": acc_a - acc_b,
        f"{acc}_diff_lo": acc_lo,
        f"{acc}_diff_hi": acc_hi,
        "mcnemar_b": test.b,
        "mcnemar_c": test.c,
        "mcnemar_p": test.p,
        f"{score}_a": seed_mean(sa),
        f"{score}_b": seed_mean(sb),
        f"{score}_diff": boot.estimate,
        f"{score}_diff_lo": boot.lo,
        f"{score}_diff_hi": boot.hi,
        f"{score}_p": signed_rank_p(d),
        f"{score}_test": SCORE_TEST + (" over examples (seed means)" if seed_col else ""),
    }


def paired_contrasts(
    examples: pl.DataFrame,
    pairs: Sequence[tuple[str, str]],
    hit: str = "hit@5",
    score: str = "target_logprob",
    by: Sequence[str] | None = None,
    example_key: Sequence[str] = ("prompt_id",),
    seed_col: str | None = None,
    holm_by: Sequence[str] = (),
    level: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> pl.DataFrame:
    """Paired contrasts "A vs B" of a run's grafts, per cell of ``by``.

    For each cell (default: each ``group`` and ``template`` of an ``examples.parquet``)
    and each pair whose two grafts both have rows there, the examples both grafts scored
    are matched on ``example_key`` (plus ``seed_col``). Accuracies are compared with the
    exact McNemar test and, for one seed, Newcombe's paired interval; ``score``'s interval
    with a paired bootstrap and its p-value with the Wilcoxon signed-rank test of the
    per-example differences (:func:`~graft.results.stats.paired.signed_rank_p`: no floor
    from a resample count, so it can survive a Holm family of hundreds of contrasts, which a
    bootstrap p of at least 2/(n_boot + 1) cannot). With ``seed_col`` (several finetune
    seeds), the McNemar counts pool every (seed, example) pair, which treats the donors as
    fixed, both intervals come from :func:`cluster_bootstrap` over seeds, then examples, and
    the signed-rank test takes each example once, its difference averaged over the seeds
    (they share their examples).

    Args:
        examples: per-example rows with columns ``graft``, ``hit``, ``score``, the ``by``
            columns, ``example_key`` and ``seed_col``.
        pairs: ``(A, B)`` graft names; differences are A minus B.
        hit: boolean hit column, e.g. ``"hit@5"``; the output names it ``acc@5``.
        score: continuous per-example column, e.g. ``"target_logprob"``.
        by: cell columns; None means those of ``("group", "template")`` present.
        example_key: columns naming one example within a cell.
        seed_col: column naming the finetune seed when the table holds several donors.
        holm_by: columns whose values form separate Holm families; by default every row
            of the returned table is one family (one for McNemar, one for ``score``).
        level: coverage of every interval.
        n_boot: bootstrap resamples.
        seed: bootstrap seed (each contrast uses it, so results do not depend on order).

    Returns:
        One row per (cell, pair) with the ``by`` columns, ``graft_a``, ``graft_b``, ``n``
        (matched examples), ``n_seeds``, ``acc@k_a``, ``acc@k_b``, ``acc@k_diff``,
        ``acc@k_diff_lo``, ``acc@k_diff_hi``, ``mcnemar_b`` (A hits, B misses),
        ``mcnemar_c`` (B hits, A misses), ``mcnemar_p``, ``mcnemar_p_holm``,
        ``{score}_a``, ``{score}_b``, ``{score}_diff``, ``{score}_diff_lo``,
        ``{score}_diff_hi``, ``{score}_p``, ``{score}_p_holm``, ``{score}_test`` (the
        test of ``{score}_p``) and ``interval`` (the method of the accuracy interval).

    Raises:
        StatsError: a missing column, an unknown graft, or an example listed twice for one
            graft in a cell (several seeds without ``seed_col``).
    """
    by = [c for c in ("group", "template") if c in examples.columns] if by is None else list(by)
    keys = list(example_key) + ([seed_col] if seed_col else [])
    need = ["graft", hit, score, *by, *keys, *holm_by]
    _check_examples(examples, pairs, need, by, keys, seed_col)
    args = {"level": level, "n_boot": n_boot, "seed": seed, "example_key": list(example_key)}
    cells = examples.partition_by(by, maintain_order=True, as_dict=True) if by else {(): examples}
    rows = []
    for key, cell in cells.items():
        present = set(cell["graft"].unique().to_list())
        for a, b in pairs:
            if a not in present or b not in present:
                continue
            joined = _pair_frame(cell, a, b, keys, [hit, score])
            if joined.is_empty():
                continue
            row = dict(zip(by, key, strict=True)) | {"graft_a": a, "graft_b": b}
            rows.append(row | _contrast_row(joined, hit, score, seed_col, args))
    return _finish_table(rows, score, holm_by, seed_col)


def _check_examples(
    examples: pl.DataFrame,
    pairs: Sequence[tuple[str, str]],
    need: list[str],
    by: list[str],
    keys: list[str],
    seed_col: str | None,
) -> None:
    """Raise unless ``examples`` has the ``need`` columns, every graft of ``pairs``, and one
    row per (graft, ``by`` cell, ``keys``)."""
    missing = sorted({c for c in need if c not in examples.columns})
    if missing:
        raise StatsError(f"paired_contrasts: columns {missing} missing (have {examples.columns})")
    known = set(examples["graft"].unique().to_list())
    unknown = sorted({g for pair in pairs for g in pair} - known)
    if unknown:
        raise StatsError(f"grafts {unknown} are not in the table; it has {sorted(known)}")
    dup = examples.select("graft", *by, *keys).is_duplicated()
    if dup.any():
        hint = "" if seed_col else "; pass seed_col when the table holds several finetune seeds"
        raise StatsError(
            f"{int(dup.sum())} rows repeat a (graft, {', '.join(by + keys)}) key{hint}"
        )


def _finish_table(
    rows: list[dict[str, Any]], score: str, holm_by: Sequence[str], seed_col: str | None
) -> pl.DataFrame:
    """Add Holm-adjusted p-values per family and the interval method; keep row order."""
    if not rows:
        return pl.DataFrame()
    table = pl.DataFrame(rows).with_row_index("__row")
    families = table.partition_by(list(holm_by), maintain_order=True) if holm_by else [table]
    adjusted = [
        f.with_columns(
            pl.Series("mcnemar_p_holm", holm(f["mcnemar_p"].to_numpy())),
            pl.Series(f"{score}_p_holm", holm(f[f"{score}_p"].to_numpy())),
        )
        for f in families
    ]
    table = pl.concat(adjusted).sort("__row").drop("__row")
    front = [c for c in table.columns if not c.startswith(score)]
    method = "cluster-bootstrap" if seed_col else "newcombe"
    ordered = front + [c for c in table.columns if c.startswith(score)]
    return table.select(ordered).with_columns(interval=pl.lit(method))
