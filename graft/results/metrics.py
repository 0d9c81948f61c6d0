"""Per-example metrics of the target token: :func:`example_metrics` turns next-token logits
into one row per example (target rank, probability, top-k hits, the top tokens); the same
columns from metrics computed inside a remote trace (:func:`row_metrics_frame`) and for
whole names (:func:`name_metrics_frame`); and the top-10 token table of E6. Summaries of
these rows are :mod:`graft.results.summary` (per group) and :mod:`graft.results.over_seeds`.

Rank convention: ``target_rank`` counts the vocabulary entries whose logit is STRICTLY
greater than the target's, so 0 means no token beats the target. A token tied with the
target does not push it down: ties are resolved in the target's favour, and ``hit@k`` is
``target_rank < k``. (``top10_ids`` lists tokens in ``torch.topk`` order, which breaks ties
arbitrarily; it can therefore disagree with ``hit@k`` only when logits tie exactly.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl
import torch

from graft.errors import ResultsError

DEFAULT_KS: tuple[int, ...] = (1, 5, 10, 50)


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
        ResultsError: on shape mismatch, a target id outside the vocabulary, or NaN logits.
    """
    logits = torch.as_tensor(logits).detach().to("cpu", torch.float32)
    targets = torch.as_tensor(target_ids).detach().to("cpu", torch.long).reshape(-1)
    if logits.ndim != 2:
        raise ResultsError(f"logits must be [n, vocab], got shape {tuple(logits.shape)}")
    n, vocab = logits.shape
    if targets.numel() != n:
        raise ResultsError(f"{targets.numel()} target ids for {n} rows of logits")
    if n and (targets.min() < 0 or targets.max() >= vocab):
        raise ResultsError(f"target ids must lie in [0, {vocab}), got {targets.tolist()}")
    if torch.isnan(logits).any():
        rows = torch.isnan(logits).any(dim=1).nonzero().flatten().tolist()
        raise ResultsError(f"NaN logits in rows {rows[:10]}{' ...' if len(rows) > 10 else ''}")
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

    ``metrics`` is what ``score_grafts(..., targets, top_k=)`` returns (target log-prob, rank,
    top ids and their log-probs; :func:`graft.core.execution.trace.unpack_row_metrics`): a remote
    run returns these few numbers per row instead of a vocabulary of logits. The rank there is
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
    """Per-example whole-name metrics from :func:`graft.core.api.continuation.score_continuations`.

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
        raise ResultsError(f"top_tokens_table needs {id_col} and {prob_col} columns")
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
