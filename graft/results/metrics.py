"""Per-example metrics of the target token and interval summaries per graft.

:func:`example_metrics` turns next-token logits into one row per example (target rank,
probability, top-k hits, the top tokens); :func:`summarize` aggregates those rows per group
(graft, template, ...): Wilson score intervals for the top-k accuracies (a proportion; 0/50
gives an upper bound of 0.07, not 0) and seeded percentile-bootstrap intervals for the mean
and median rank, the mean probability and the mean log-probability.

Rank convention: ``target_rank`` counts the vocabulary entries whose logit is STRICTLY
greater than the target's, so 0 means no token beats the target. A token tied with the
target does not push it down: ties are resolved in the target's favour, and ``hit@k`` is
``target_rank < k``. (``top10_ids`` lists tokens in ``torch.topk`` order, which breaks ties
arbitrarily; it can therefore disagree with ``hit@k`` only when logits tie exactly.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl
import torch

from graft.results.stats import seed_summary, wilson_interval

DEFAULT_KS: tuple[int, ...] = (1, 5, 10, 50)
# Largest index matrix (resamples x examples) drawn at once; bounds bootstrap memory.
_MAX_BOOT_CELLS = 4_000_000


def _decode_all(tokenizer: Any, ids: Sequence[int]) -> dict[int, str]:
    unique = sorted(set(ids))
    if hasattr(tokenizer, "batch_decode"):
        texts = tokenizer.batch_decode([[i] for i in unique])
    else:
        texts = [tokenizer.decode([i]) for i in unique]
    return dict(zip(unique, texts, strict=True))


@torch.no_grad()
def example_metrics(
    logits: torch.Tensor,
    target_ids: torch.Tensor | Sequence[int],
    tokenizer: Any = None,
    ks: Sequence[int] = DEFAULT_KS,
    top: int = 10,
) -> pl.DataFrame:
    """Metrics of the target token for each row of next-token logits.

    Args:
        logits: ``[n, vocab]`` next-token logits (any float dtype; computed in float32).
        target_ids: ``[n]`` target token ids.
        tokenizer: when given, ``target_text`` and ``top{top}_tokens`` are decoded with it.
        ks: the k of the ``hit@k`` columns.
        top: how many top tokens to list per row.

    Returns:
        One row per example with columns ``target_id`` (Int64), ``target_text`` (Utf8, only
        with a tokenizer), ``target_rank`` (Int64, 0 = top, strict-greater count, see module
        docstring), ``target_prob``, ``target_logprob`` (Float64, from a float32
        log-softmax), ``hit@k`` (Boolean, one per k), ``top{top}_ids`` (List[Int64]),
        ``top{top}_tokens`` (List[Utf8], only with a tokenizer), ``top{top}_probs``
        (List[Float64]).

    Raises:
        ValueError: on shape mismatch, a target id outside the vocabulary, or NaN logits.
    """
    logits = torch.as_tensor(logits).detach().to("cpu", torch.float32)
    targets = torch.as_tensor(target_ids).detach().to("cpu", torch.long).reshape(-1)
    if logits.ndim != 2:
        raise ValueError(f"logits must be [n, vocab], got shape {tuple(logits.shape)}")
    n, vocab = logits.shape
    if targets.numel() != n:
        raise ValueError(f"{targets.numel()} target ids for {n} rows of logits")
    if n and (targets.min() < 0 or targets.max() >= vocab):
        raise ValueError(f"target ids must lie in [0, {vocab}), got {targets.tolist()}")
    if torch.isnan(logits).any():
        rows = torch.isnan(logits).any(dim=1).nonzero().flatten().tolist()
        raise ValueError(f"NaN logits in rows {rows[:10]}{' ...' if len(rows) > 10 else ''}")
    top = min(top, vocab)

    logprobs = torch.log_softmax(logits, dim=-1)
    target_logit = logits.gather(1, targets[:, None])
    rank = (logits > target_logit).sum(dim=1)
    target_logprob = logprobs.gather(1, targets[:, None]).squeeze(1)
    _, top_ids = torch.topk(logits, top, dim=-1)
    return _metrics_frame(
        targets, rank, target_logprob, top_ids, logprobs.gather(1, top_ids), tokenizer, ks
    )


def row_metrics_frame(
    target_ids: torch.Tensor | Sequence[int],
    metrics: Mapping[str, torch.Tensor],
    tokenizer: Any = None,
    ks: Sequence[int] = DEFAULT_KS,
) -> pl.DataFrame:
    """:func:`example_metrics`' table from metrics computed inside the trace.

    ``metrics`` is what ``run_grafts(..., targets=, top_k=)`` returns (target log-prob, rank,
    top ids and their log-probs; :func:`graft.core.trace.unpack_row_metrics`): a remote run
    returns these few numbers per row instead of a vocabulary of logits. The rank there is
    counted on float32 log-probabilities rather than logits: the same order, up to ties that
    rounding creates.
    """
    targets = torch.as_tensor(target_ids).detach().to("cpu", torch.long).reshape(-1)
    return _metrics_frame(
        targets,
        metrics["target_rank"].cpu(),
        metrics["target_logprob"].cpu(),
        metrics["top_ids"].cpu(),
        metrics["top_logprobs"].cpu(),
        tokenizer,
        ks,
    )


def name_metrics_frame(scores: Mapping[str, torch.Tensor]) -> pl.DataFrame:
    """Per-example whole-name metrics from :func:`graft.core.continuation.score_continuations`.

    Returns:
        ``name_tokens`` (Int64: the target's tokens), ``name_logprob`` (Float64: the sum of
        their teacher-forced log-probabilities) and ``name_exact`` (Boolean: every token is
        the most probable one given the previous ones, i.e. greedy decoding reproduces the
        whole target), one row per example.
    """
    return pl.DataFrame(
        {
            "name_tokens": pl.Series(scores["tokens"].tolist(), dtype=pl.Int64),
            "name_logprob": pl.Series(scores["logprob"].tolist(), dtype=pl.Float64),
            "name_exact": pl.Series(scores["exact"].tolist(), dtype=pl.Boolean),
        }
    )


def _metrics_frame(targets, rank, target_logprob, top_ids, top_logprobs, tokenizer, ks):
    """The per-example table shared by :func:`example_metrics` and :func:`row_metrics_frame`."""
    top = top_ids.shape[1]
    columns: dict[str, Any] = {"target_id": pl.Series(targets.tolist(), dtype=pl.Int64)}
    top_id_lists = top_ids.tolist()
    if tokenizer is not None:
        texts = _decode_all(tokenizer, targets.tolist() + [i for row in top_id_lists for i in row])
        columns["target_text"] = pl.Series([texts[i] for i in targets.tolist()], dtype=pl.Utf8)
    columns["target_rank"] = pl.Series(rank.tolist(), dtype=pl.Int64)
    columns["target_prob"] = pl.Series(target_logprob.exp().tolist(), dtype=pl.Float64)
    columns["target_logprob"] = pl.Series(target_logprob.tolist(), dtype=pl.Float64)
    for k in ks:
        columns[f"hit@{k}"] = pl.Series((rank < k).tolist(), dtype=pl.Boolean)
    columns[f"top{top}_ids"] = pl.Series(top_id_lists, dtype=pl.List(pl.Int64))
    if tokenizer is not None:
        columns[f"top{top}_tokens"] = pl.Series(
            [[texts[i] for i in row] for row in top_id_lists], dtype=pl.List(pl.Utf8)
        )
    columns[f"top{top}_probs"] = pl.Series(top_logprobs.exp().tolist(), dtype=pl.List(pl.Float64))
    return pl.DataFrame(columns)


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
    funcs = {"mean": np.mean, "median": np.median}
    specs = {}
    for out, spec in statistics.items():
        func, _, name = spec.partition(":")
        if func not in funcs or name not in arrays:
            raise ValueError(
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
        for out, (func, v) in specs.items():
            draws[out].append(func(v[idx], axis=1))
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
        )  # graft.study.prompts.DropReport or a plain dict
        return {str(k): int(v) for k, v in (counts or {}).items()}

    def fmt(counts: dict[str, int]) -> str:
        return "; ".join(f"{k}={v}" for k, v in sorted(counts.items()) if v)

    if drops_by is None:
        counts = as_counts(drops)
        return [sum(counts.values())] * groups.height, [fmt(counts)] * groups.height
    if drops_by not in groups.columns:
        raise ValueError(f"drops_by={drops_by!r} is not one of the group columns {groups.columns}")
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
        raise ValueError(f"unknown interval method {method!r}; use one of {', '.join(texts)}")
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
            ``graft.study.prompts.DropReport``) applying to every group, or, with ``drops_by``, a
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
        raise ValueError(f"summarize: columns {missing} missing (have {df.columns})")
    if drops_by is not None and drops is None:
        raise ValueError("drops_by given without drops")

    stats = _bootstrap_stats(df)
    boot = {"n_boot": n_boot, "seed": seed, "ci": ci}
    parts = df.partition_by(by, maintain_order=True, as_dict=True) if by else {(): df}
    rows = [
        dict(zip(by, key, strict=True)) | _summary_row(group, ks, stats, boot)
        for key, group in parts.items()
    ]
    proportions = _proportions(df, ks)
    names = proportions + list(stats)
    schema = {c: df.schema[c] for c in by} | {"n": pl.Int64}
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


def top_tokens_table(
    df: pl.DataFrame,
    by: Sequence[str] = ("graft",),
    per_group: int = 5,
    seed: int = 0,
    top: int = 10,
    keep: Sequence[str] = ("prompt_id", "text", "target_text"),
) -> pl.DataFrame:
    """Long table of the top next tokens for a few sampled examples per group (paper C.7).

    Args:
        df: rows from :func:`example_metrics` plus the group columns.
        by: group columns.
        per_group: examples sampled per group (all when the group is smaller).
        seed: sampling seed.
        top: which ``top{top}_*`` columns to read.
        keep: per-example columns to carry along when present.

    Returns:
        Columns: the ``by`` columns, ``example`` (Int64 row index within the group),
        ``rank`` (0-based position in the top list), ``token_id``, ``token`` (when
        decoded), ``prob``, ``is_target``, ``target_id`` and ``target_rank`` of the
        example, then the ``keep`` columns that exist.
    """
    by = list(by)
    extra = [c for c in keep if c in df.columns and c not in by]
    id_col, tok_col, prob_col = f"top{top}_ids", f"top{top}_tokens", f"top{top}_probs"
    lists = [c for c in (id_col, tok_col, prob_col) if c in df.columns]
    if id_col not in lists or prob_col not in lists:
        raise ValueError(f"top_tokens_table needs {id_col} and {prob_col} columns")
    frames = []
    parts = df.partition_by(by, maintain_order=True) if by else [df]
    for group in parts:
        group = group.with_row_index("example").with_columns(pl.col("example").cast(pl.Int64))
        rng = np.random.default_rng([seed, group.height])
        take = np.sort(rng.choice(group.height, size=min(per_group, group.height), replace=False))
        picked = group.filter(pl.col("example").is_in(take.tolist())).select(
            *by, "example", "target_id", "target_rank", *extra, *lists
        )
        frames.append(picked)
    if not frames:
        return pl.DataFrame()
    long = (
        pl.concat(frames)
        .explode(lists)
        .rename(
            {id_col: "token_id", prob_col: "prob"}
            | ({tok_col: "token"} if tok_col in lists else {})
        )
    )
    long = long.with_columns(
        rank=pl.int_range(pl.len()).over([*by, "example"]).cast(pl.Int64),
        is_target=pl.col("token_id") == pl.col("target_id"),
    )
    order = [*by, "example", "rank", "token_id", *(["token"] if tok_col in lists else [])]
    return long.select(*order, "prob", "is_target", "target_id", "target_rank", *extra)


# ------------------------------------------------------------------ over replicates

#: The columns naming a run's replicate (its data seed and finetune seed) in its examples
#: and summary tables.
REPLICATE_COLUMNS: tuple[str, ...] = ("data_seed", "finetune_seed")


def seed_ci_text(n_seeds: int, ci: float = 0.95) -> str:
    """What the interval of a mean over ``n_seeds`` replicates is, for tables and footnotes."""
    return (
        f"{100 * ci:g}% t interval over {n_seeds} replicates (their values' mean and "
        f"sd, {n_seeds - 1} df), widened to the pooled within-replicate interval"
    )


def _is_proportion(stat: str) -> bool:
    return stat.startswith("acc@") or stat == "name_exact"


def _within_interval(group: pl.DataFrame, stat: str, mean: float, ci: float):
    """The interval of the pooled mean from the prompts alone: Wilson on every replicate's
    prompts together for a proportion, else the replicates' mean half-width / sqrt(count).

    Replicates that agree give a t interval of width 0 (three seeds at 1/50 each: [0.02,
    0.02]); this keeps the uncertainty of the prompts sampled."""
    if _is_proportion(stat) and "n" in group.columns:
        n = group["n"].cast(pl.Int64).to_numpy()
        k = int(round(float((group[stat].cast(pl.Float64).to_numpy() * n).sum())))
        return wilson_interval(k, int(n.sum()), ci)
    if {f"{stat}_lo", f"{stat}_hi"} <= set(group.columns):
        widths = (group[f"{stat}_hi"] - group[f"{stat}_lo"]).cast(pl.Float64).to_numpy()
        if np.isfinite(widths).all():
            half = float(widths.mean()) / 2 / math.sqrt(group.height)
            return mean - half, mean + half
    return mean, mean


def _value_bounds(stat: str) -> tuple[float, float]:
    """The range a statistic can take (a t interval is clipped to it)."""
    if stat.startswith("acc@") or stat in ("name_exact", "mean_prob"):
        return 0.0, 1.0
    if "rank" in stat:
        return 0.0, math.inf
    if "logprob" in stat:
        return -math.inf, 0.0
    return -math.inf, math.inf


def _mean_row(
    group: pl.DataFrame, stats: Sequence[str], seed_cols: Sequence[str], ci: float
) -> dict[str, Any]:
    """The mean-over-replicates row of one group's per-replicate rows (sorted by seed)."""
    row: dict[str, Any] = dict.fromkeys(seed_cols)
    row["n"] = int(group["n"].max())
    row["n_seeds"] = group.height
    labels = zip(*(group[c].to_list() for c in seed_cols), strict=True)
    row["per_seed_of"] = ",".join(
        "-".join(f"{c[0]}{v}" for c, v in zip(seed_cols, label, strict=True)) for label in labels
    )
    for stat in stats:
        values = group[stat].cast(pl.Float64).to_numpy()
        if np.isfinite(values).all():
            summary = seed_summary(values, ci)
            low, high = _value_bounds(stat)
            w_lo, w_hi = _within_interval(group, stat, summary.mean, ci)
            lo, hi = min(summary.lo, w_lo), max(summary.hi, w_hi)
            mean, lo, hi = summary.mean, max(low, lo), min(high, hi)
        else:
            mean = lo = hi = math.nan
        row[stat], row[f"{stat}_lo"], row[f"{stat}_hi"] = mean, lo, hi
        row[f"{stat}_per_seed"] = values.tolist()
        row[f"{stat}_ci_method"] = seed_ci_text(group.height, ci)
    if "n_dropped" in group.columns:
        row["n_dropped"] = int(group["n_dropped"].max())
        reasons = [r for r in dict.fromkeys(group["dropped_reasons"].to_list()) if r]
        row["dropped_reasons"] = " | ".join(reasons)
    return row


def summarize_over_seeds(
    per_seed: pl.DataFrame,
    by: Sequence[str] = ("group", "template", "graft"),
    seed_cols: Sequence[str] = REPLICATE_COLUMNS,
    ci: float = 0.95,
) -> pl.DataFrame:
    """Per-replicate summary rows plus, for each ``by`` group of several replicates, the mean
    over them with a between-replicate interval.

    Every replicate (a donor finetuned with one seed, on one data seed's facts) is one draw
    of the finetune, so the mean row's interval is the Student-t interval of the
    per-replicate values (:func:`graft.results.stats.seed_summary`), widened where needed to
    the pooled interval over prompts (Wilson on all replicates' prompts for accuracies), and
    clipped to the range the statistic can take: it covers finetune-to-finetune spread and
    the prompts sampled, while each per-replicate row keeps its own interval over prompts.

    Args:
        per_seed: rows of :func:`summarize` grouped by ``by`` and ``seed_cols``.
        by: the columns of one result (graft, template, ...).
        seed_cols: the columns naming a replicate.
        ci: coverage of the interval.

    Returns:
        ``per_seed`` unchanged when no group has several replicates. Otherwise ``per_seed``
        with ``n_seeds`` = 1, and one more row per group of several replicates: the
        ``seed_cols`` null, ``n`` (prompts per replicate, the largest), ``n_seeds``,
        ``per_seed_of`` (the replicates, ``d<data seed>-f<finetune seed>``, comma-separated),
        for each statistic ``s`` with an interval: ``s`` (the mean), ``s_lo``, ``s_hi``,
        ``s_per_seed`` (the replicates' values, in ``per_seed_of`` order) and
        ``s_ci_method`` (:func:`seed_ci_text`); ``n_dropped`` is the most any replicate
        dropped.
    """
    by, seed_cols = list(by), list(seed_cols)
    columns = set(per_seed.columns)
    stats = [c for c in per_seed.columns if {f"{c}_lo", f"{c}_hi"} <= columns]
    parts = per_seed.partition_by(by, maintain_order=True, as_dict=True) if by else {(): per_seed}
    rows = [
        dict(zip(by, key, strict=True)) | _mean_row(group.sort(seed_cols), stats, seed_cols, ci)
        for key, group in parts.items()
        if group.height > 1
    ]
    if not rows:
        return per_seed
    schema = {c: per_seed.schema[c] for c in by + seed_cols} | {
        "n": pl.Int64,
        "n_seeds": pl.Int64,
        "per_seed_of": pl.Utf8,
    }
    for stat in stats:
        schema |= {stat: pl.Float64, f"{stat}_lo": pl.Float64, f"{stat}_hi": pl.Float64}
        schema |= {f"{stat}_per_seed": pl.List(pl.Float64), f"{stat}_ci_method": pl.Utf8}
    if "n_dropped" in columns:
        schema |= {"n_dropped": pl.Int64, "dropped_reasons": pl.Utf8}
    means = pl.DataFrame(rows, schema=schema, orient="row")
    with_count = per_seed.with_columns(n_seeds=pl.lit(1, dtype=pl.Int64))
    return pl.concat([with_count, means], how="diagonal_relaxed")


def format_per_seed(values: pl.Series) -> pl.Series:
    """A ``<metric>_per_seed`` list column as text, ``"0.920 / 0.840 / 0.880"``."""
    return pl.Series(
        values.name,
        [None if v is None else " / ".join(f"{x:.3f}" for x in v) for v in values.to_list()],
        dtype=pl.Utf8,
    )
