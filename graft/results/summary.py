"""Summaries of per-example metrics per group (graft, template, ...): Wilson score intervals
for the top-k accuracies (a proportion; 0/50 gives an upper bound of 0.07, not 0) and seeded
percentile-bootstrap intervals for the mean and median rank, the mean probability and the
mean log-probability (and the whole-name scores where a run has them)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl

from graft.errors import ResultsError
from graft.results.metrics import DEFAULT_KS
from graft.results.stats import wilson_interval

# Largest index matrix (resamples x examples) drawn at once; bounds bootstrap memory.
_MAX_BOOT_CELLS = 4_000_000


def _group_seed(seed: int, n: int) -> np.random.Generator:
    # Seeded by (seed, n) only: a group's CI does not depend on which other groups exist
    # or their order, and groups of equal size draw the same resamples (a paired
    # bootstrap when they list the same examples in the same order).
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, n])))


def bootstrap_ci(
    values: Mapping[str, np.ndarray],
    statistics: Mapping[str, str],
    n_boot: int = 1000,
    seed: int = 0,
    ci: float = 0.95,
) -> dict[str, tuple[float, float]]:
    """Percentile-bootstrap CIs of several statistics over the same examples.

    Every resample draws one set of example indices shared by all statistics.

    Args:
        values: name -> 1-D array of per-example values (all the same length n >= 1).
        statistics: output name -> ``"<mean|median>:<values name>"``.
        n_boot: number of resamples (0 gives degenerate intervals at the point estimate).
        seed: base seed; the generator is seeded with ``(seed, n)``.
        ci: coverage of the central interval.

    Returns:
        output name -> (lo, hi).
    """
    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in values.items()}
    n = len(next(iter(arrays.values())))
    funcs: dict[str, Callable[..., Any]] = {"mean": np.mean, "median": np.median}
    specs: dict[str, tuple[Callable[..., Any], np.ndarray]] = {}
    for out, spec in statistics.items():
        func, _, name = spec.partition(":")
        if func not in funcs or name not in arrays:
            raise ResultsError(
                f"statistic {spec!r}: expected '<mean|median>:<one of {list(arrays)}>'"
            )
        specs[out] = (funcs[func], arrays[name])
    if n == 0:
        return {out: (math.nan, math.nan) for out in specs}
    if n_boot <= 0:
        return {out: (float(f(v)), float(f(v))) for out, (f, v) in specs.items()}
    rng = _group_seed(seed, n)
    draws: dict[str, list[np.ndarray]] = {out: [] for out in specs}
    chunk = max(1, _MAX_BOOT_CELLS // n)
    for start in range(0, n_boot, chunk):
        idx = rng.integers(0, n, size=(min(chunk, n_boot - start), n))
        for out, (stat, v) in specs.items():
            draws[out].append(stat(v[idx], axis=1))
    alpha = (1.0 - ci) / 2.0
    result = {}
    for out, parts in draws.items():
        lo, hi = np.quantile(np.concatenate(parts), [alpha, 1.0 - alpha])
        result[out] = (float(lo), float(hi))
    return result


def _drop_columns(
    groups: pl.DataFrame, drops: Any, drops_by: str | None
) -> tuple[list[int], list[str]]:
    """``n_dropped`` and ``dropped_reasons`` for each row of ``groups``."""

    def as_counts(report: Any) -> dict[str, int]:
        counts = getattr(
            report, "dropped", report
        )  # graft.study.data.prompts.DropReport or a plain dict
        return {str(k): int(v) for k, v in (counts or {}).items()}

    def fmt(counts: dict[str, int]) -> str:
        return "; ".join(f"{k}={v}" for k, v in sorted(counts.items()) if v)

    if drops_by is None:
        counts = as_counts(drops)
        return [sum(counts.values())] * groups.height, [fmt(counts)] * groups.height
    if drops_by not in groups.columns:
        raise ResultsError(
            f"drops_by={drops_by!r} is not one of the group columns {groups.columns}"
        )
    per_key = {key: as_counts(report) for key, report in drops.items()}
    rows = [per_key.get(key, {}) for key in groups[drops_by].to_list()]
    return [sum(c.values()) for c in rows], [fmt(c) for c in rows]


def ci_method_text(method: str, ci: float = 0.95) -> str:
    """What a summary's ``_lo``/``_hi`` columns are, for tables and figure footnotes.

    Args:
        method: ``"wilson"`` (score interval of a proportion), ``"bootstrap"`` (percentile
            bootstrap over examples) or ``"none"`` (no resampling: the interval is the point).
        ci: coverage of the interval.
    """
    level = f"{100 * ci:g}%"
    texts = {
        "wilson": f"{level} Wilson interval",
        "bootstrap": f"{level} bootstrap CI",
        "none": "no interval (no bootstrap resamples)",
    }
    if method not in texts:
        raise ResultsError(f"unknown interval method {method!r}; use one of {', '.join(texts)}")
    return texts[method]


def _bootstrap_stats(df: pl.DataFrame) -> dict[str, str]:
    """The bootstrapped statistics of :func:`summarize` (``mean_logprob`` when the rows
    carry ``target_logprob``, ``mean_name_logprob`` when they carry ``name_logprob``)."""
    stats = {"mean_rank": "mean:rank", "median_rank": "median:rank", "mean_prob": "mean:prob"}
    if "target_logprob" in df.columns:
        stats["mean_logprob"] = "mean:logprob"
    if "name_logprob" in df.columns:
        stats["mean_name_logprob"] = "mean:name_logprob"
    return stats


def _proportions(df: pl.DataFrame, ks: Sequence[int]) -> list[str]:
    """The proportions of :func:`summarize` (Wilson intervals): ``acc@k`` for each k, and
    ``name_exact`` when the rows carry it."""
    return [f"acc@{k}" for k in ks] + (["name_exact"] if "name_exact" in df.columns else [])


def _summary_row(
    group: pl.DataFrame, ks: Sequence[int], stats: Mapping[str, str], boot: dict[str, Any]
) -> dict[str, Any]:
    """``n`` and every statistic with its interval for the examples of one group."""
    rank = group["target_rank"].to_numpy().astype(np.float64)
    n = group.height
    row: dict[str, Any] = {"n": n}
    for k in ks:
        hits = int((rank < k).sum())
        row[f"acc@{k}"] = hits / n
        row[f"acc@{k}_lo"], row[f"acc@{k}_hi"] = wilson_interval(hits, n, boot["ci"])
    if "name_exact" in group.columns:
        hits = int(group["name_exact"].sum())
        row["name_exact"] = hits / n
        row["name_exact_lo"], row["name_exact_hi"] = wilson_interval(hits, n, boot["ci"])
    values = {"rank": rank, "prob": group["target_prob"].to_numpy().astype(np.float64)}
    if "mean_logprob" in stats:
        values["logprob"] = group["target_logprob"].to_numpy().astype(np.float64)
    if "mean_name_logprob" in stats:
        values["name_logprob"] = group["name_logprob"].to_numpy().astype(np.float64)
    intervals = bootstrap_ci(values, stats, **boot)
    for out, spec in stats.items():
        func, _, name = spec.partition(":")
        row[out] = float(np.mean(values[name]) if func == "mean" else np.median(values[name]))
        row[f"{out}_lo"], row[f"{out}_hi"] = intervals[out]
    return row


def summarize(
    df: pl.DataFrame,
    by: Sequence[str] = ("graft",),
    ks: Sequence[int] = DEFAULT_KS,
    n_boot: int = 1000,
    seed: int = 0,
    ci: float = 0.95,
    drops: Any = None,
    drops_by: str | None = None,
) -> pl.DataFrame:
    """Aggregate per-example metrics per group, with confidence intervals.

    Accuracies get Wilson score intervals (:func:`graft.results.stats.wilson_interval`);
    ranks, probabilities and log-probabilities a percentile bootstrap over examples.

    Args:
        df: rows from :func:`example_metrics` plus the group columns (needs ``target_rank``
            and ``target_prob``; ``target_logprob`` adds ``mean_logprob``; the whole-name
            columns of :func:`name_metrics_frame` add ``name_exact`` (Wilson) and
            ``mean_name_logprob``).
        by: group columns, e.g. ``["graft", "template"]``; empty for one overall group.
        ks: top-k accuracies to report (computed as ``target_rank < k``).
        n_boot: bootstrap resamples per group (examples resampled with replacement; the
            same indices serve every bootstrapped statistic of a group).
        seed: bootstrap seed; the result is deterministic for a seed.
        ci: coverage of every interval (0.95: Wilson at z = 1.96, and the 2.5th and
            97.5th bootstrap percentiles).
        drops: optional drop report: a reason -> count mapping (or a
            ``graft.study.data.prompts.DropReport``) applying to every group, or, with ``drops_by``, a
            mapping from values of that group column to such reports.
        drops_by: group column that keys ``drops`` (e.g. ``"template"``).

    Returns:
        One row per group, in order of first appearance: the ``by`` columns, ``n``, then
        for each statistic ``s`` in ``acc@k`` (each k), (``name_exact``,) ``mean_rank``,
        ``median_rank``, ``mean_prob`` (and ``mean_logprob``, ``mean_name_logprob``) the
        columns ``s``, ``s_lo``, ``s_hi``; then
        ``n_dropped`` and ``dropped_reasons`` (``"reason=count; ..."``) when ``drops`` is
        given; last, for each statistic, ``s_ci_method``: what its interval is (see
        :func:`ci_method_text`, e.g. ``"95% Wilson interval"``).
    """
    by = list(by)
    missing = [c for c in [*by, "target_rank", "target_prob"] if c not in df.columns]
    if missing:
        raise ResultsError(f"summarize: columns {missing} missing (have {df.columns})")
    if drops_by is not None and drops is None:
        raise ResultsError("drops_by given without drops")

    stats = _bootstrap_stats(df)
    boot = {"n_boot": n_boot, "seed": seed, "ci": ci}
    parts = df.partition_by(by, maintain_order=True, as_dict=True) if by else {(): df}
    rows = [
        dict(zip(by, key, strict=True)) | _summary_row(group, ks, stats, boot)
        for key, group in parts.items()
    ]
    proportions = _proportions(df, ks)
    names = proportions + list(stats)
    schema: dict[str, Any] = {c: df.schema[c] for c in by} | {"n": pl.Int64}
    schema |= {f"{s}{suffix}": pl.Float64 for s in names for suffix in ("", "_lo", "_hi")}
    out = pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)
    if drops is not None:
        n_dropped, reasons = _drop_columns(out, drops, drops_by)
        out = out.with_columns(
            pl.Series("n_dropped", n_dropped, dtype=pl.Int64),
            pl.Series("dropped_reasons", reasons, dtype=pl.Utf8),
        )
    boot_method = ci_method_text("bootstrap" if n_boot > 0 else "none", ci)
    methods = dict.fromkeys(proportions, ci_method_text("wilson", ci))
    methods |= dict.fromkeys(stats, boot_method)
    return out.with_columns(
        pl.lit(text, dtype=pl.Utf8).alias(f"{s}_ci_method") for s, text in methods.items()
    )
