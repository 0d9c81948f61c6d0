"""The tables of the logit lens in a run folder: each stored batch's frame (a row per
example, graft, layer and position, with the top-k tokens), which stored batches are stale,
the summary per (group, template, graft, position, layer) with ``same_as``, and the top-1
tokens of a few prompts (``lens_top_tokens.csv``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import polars as pl

from graft.results.plots.lens import EMBEDDING_LAYER, layer_label
from graft.results.summary import summarize
from graft.study.analyses.lens_trace import POSITIONS, LensScores
from graft.study.data.prompts import TestExample
from graft.study.specs.grafts import NamedGraft
from graft.study.specs.run import AnalysisSpec

#: The table of per-(row, layer, position) scores, and the stem of its summary.
LENS_TABLE = "lens"
LENS_SUMMARY = "lens_summary"
#: The human-readable table of top-1 tokens of a few prompts (``.csv`` only).
LENS_TOP_TOKENS = "lens_top_tokens"
#: The columns one summary row is grouped by.
LENS_BY = ("group", "template", "graft", "position", "layer")
#: Prompts per template in ``lens_top_tokens.csv`` (the run's first sampled ones).
TOP_TOKEN_PROMPTS = 3
#: The per-(row, layer, position) top-k columns of the lens table.
TOP_COLUMNS = ("top_ids", "top_tokens", "top_probs")


def token_texts(tokenizer: Any, ids: Iterable[int]) -> dict[int, str]:
    """Each id's text, decoded alone by ``tokenizer`` (``" Paris"``, with its space)."""
    unique = sorted(set(ids))
    return dict(zip(unique, tokenizer.batch_decode([[i] for i in unique]), strict=True))


def lens_frame(
    scores: LensScores,
    chunk: Sequence[tuple[int, int]],
    examples: Sequence[TestExample],
    grafts: Sequence[NamedGraft],
    data_seed: int,
    tokenizer: Any,
) -> pl.DataFrame:
    """One stored batch of the lens table: a row per (example, graft, layer, position), the
    layer -1 (:data:`EMBEDDING_LAYER`) the embeddings, then the output of each layer; the
    target's rank and probability and the top-k tokens (ids, texts decoded by
    ``tokenizer``, probabilities)."""
    n_rows, n_layers, n_pos = scores.target_rank.shape
    stored = scores.has_position[:, None, :].expand(n_rows, n_layers, n_pos)
    row, layer, pos = stored.nonzero().unbind(1)  # row, then layer, then position order
    logprob = scores.target_logprob[row, layer, pos].double()
    top_ids = scores.top_ids[row, layer, pos].tolist()
    top_probs = scores.top_logprob[row, layer, pos].double().exp().tolist()
    ex = [examples[chunk[i][0]] for i in row.tolist()]
    gr = [grafts[chunk[i][1]] for i in row.tolist()]
    texts = token_texts(tokenizer, [i for ids in top_ids for i in ids] + [e.target_id for e in ex])
    return pl.DataFrame(
        {
            "graft": [g.name for g in gr],
            "group": [g.group for g in gr],
            "spec": [str(g.spec) for g in gr],
            "template": [e.template for e in ex],
            "direction": [e.direction for e in ex],
            "prompt_id": [e.prompt_id for e in ex],
            "fact_id": [e.fact_id for e in ex],
            "data_seed": pl.Series([data_seed] * len(ex), dtype=pl.Int64),
            "position": [POSITIONS[p] for p in pos.tolist()],
            "layer": pl.Series((layer + EMBEDDING_LAYER).tolist(), dtype=pl.Int64),
            "target_id": pl.Series([e.target_id for e in ex], dtype=pl.Int64),
            "target_token": pl.Series([texts[e.target_id] for e in ex], dtype=pl.Utf8),
            "target_rank": pl.Series(scores.target_rank[row, layer, pos].tolist(), dtype=pl.Int64),
            "target_prob": pl.Series(logprob.exp().tolist(), dtype=pl.Float64),
            "target_logprob": pl.Series(logprob.tolist(), dtype=pl.Float64),
            "top_ids": pl.Series(top_ids, dtype=pl.List(pl.Int64)),
            "top_tokens": pl.Series(
                [[texts[i] for i in ids] for ids in top_ids], dtype=pl.List(pl.Utf8)
            ),
            "top_probs": pl.Series(top_probs, dtype=pl.List(pl.Float64)),
        }
    )


def stale_batches(stored: pl.DataFrame, width: int) -> set[str]:
    """Batches of ``stored`` (the lens parts read with a ``batch`` column) written in an
    older layout or with another top-k: no embedding layer, no top-k columns, or top-k lists
    of another ``width``. Such a batch is computed again."""
    if stored.is_empty():
        return set()
    batches = set(stored["batch"].unique().to_list())
    if any(c not in stored.columns for c in ("layer", *TOP_COLUMNS)):
        return batches
    fresh = (
        stored.group_by("batch")
        .agg(
            (pl.col("layer").min() == EMBEDDING_LAYER).alias("emb"),
            (pl.col("top_ids").list.len() == width).all().alias("width"),
        )
        .filter(pl.col("emb") & pl.col("width"))
    )
    return batches - set(fresh["batch"].to_list())


def first_prompts(examples: Sequence[TestExample], per_template: int) -> list[str]:
    """The first ``per_template`` prompt ids of each template in the run's (seeded) sample."""
    taken: dict[str, list[str]] = {}
    for e in examples:
        ids = taken.setdefault(e.template, [])
        if len(ids) < per_template and e.prompt_id not in ids:
            ids.append(e.prompt_id)
    return [i for ids in taken.values() for i in ids]


def summarize_lens(
    table: pl.DataFrame,
    grafts: Sequence[NamedGraft],
    analysis: AnalysisSpec,
    same_as: Mapping[tuple[str, str, str, str], str] | None = None,
) -> pl.DataFrame:
    """The lens summary per (group, template, graft, position, layer), grafts in run order,
    with the run's bootstrap (:func:`graft.results.summary.summarize`); ``same_as``: the
    earlier graft whose line this one is by causality (:func:`identical_lines`), else null."""
    summary = summarize(
        table.drop(TOP_COLUMNS, strict=False),
        by=list(LENS_BY),
        n_boot=analysis.n_boot,
        seed=analysis.seed,
    )
    same = same_as or {}
    keys = summary.select("group", "template", "graft", "position").iter_rows()
    summary = summary.with_columns(pl.Series("same_as", [same.get(k) for k in keys], dtype=pl.Utf8))
    order = {g.name: i for i, g in enumerate(grafts)}
    places = {p: i for i, p in enumerate(POSITIONS)}
    return summary.sort(
        [
            pl.col("group"),
            pl.col("template"),
            pl.col("position").replace_strict(places, default=len(places)),
            pl.col("graft").replace_strict(order, default=len(order)),
            pl.col("layer"),
        ],
        maintain_order=True,
    )


def top_tokens_table(
    table: pl.DataFrame,
    prompt_ids: Sequence[str],
    texts: Mapping[str, str] | None = None,
    grafts: Sequence[NamedGraft] = (),
) -> pl.DataFrame:
    """The logit-lens table of a few prompts, one row per (template, prompt, graft, layer):
    at each position, the top-1 token (as Python writes the string, so spaces and newlines
    show) with its probability, and the target's rank there.

    Columns: ``template``, ``prompt_id``, ``prompt`` (with ``texts``), ``target`` (the
    target token), ``graft``, ``layer`` (``emb``, ``0``, ``1``, ...), then per position
    ``<position>`` (e.g. ``' Paris' 0.41``) and ``<position> target rank``.

    Args:
        table: the lens table (:func:`lens_frame`'s columns).
        prompt_ids: the prompts shown, in this order.
        texts: prompt id -> the prompt's text.
        grafts: the run's grafts (their order; default: as they appear).
    """
    picked = table.filter(pl.col("prompt_id").is_in(list(prompt_ids)))
    if picked.is_empty():
        return pl.DataFrame()
    cell = pl.format(
        "{} {}",
        pl.col("top_tokens").list.first().map_elements(repr, return_dtype=pl.Utf8),
        pl.col("top_probs").list.first().round(2).cast(pl.Utf8),
    )
    index = ["template", "prompt_id", "target_token", "graft", "layer"]
    long = picked.select(*index, "position", cell.alias("top1"), "target_rank")
    wide = long.pivot(on="position", index=index, values=["top1", "target_rank"])
    positions = [p for p in POSITIONS if f"top1_{p}" in wide.columns]
    order = {n: i for i, n in enumerate(dict.fromkeys([g.name for g in grafts]))}
    prompts = {p: i for i, p in enumerate(prompt_ids)}
    wide = wide.sort(
        pl.col("prompt_id").replace_strict(prompts, default=len(prompts)),
        pl.col("graft").replace_strict(order, default=len(order)),
        pl.col("layer"),
    )
    return wide.select(
        "template",
        "prompt_id",
        *(
            [pl.col("prompt_id").replace_strict(texts, default=None).alias("prompt")]
            if texts
            else []
        ),
        pl.col("target_token").map_elements(repr, return_dtype=pl.Utf8).alias("target"),
        "graft",
        pl.col("layer").map_elements(layer_label, return_dtype=pl.Utf8),
        *(
            c
            for p in positions
            for c in (
                pl.col(f"top1_{p}").alias(p),
                pl.col(f"target_rank_{p}").alias(f"{p} target rank"),
            )
        ),
    )
