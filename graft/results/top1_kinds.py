"""What kind of token a graft predicts (paper §4, "What the graft predicts instead"): each
row's top-1 next token classified as the start of an actor's name, the start of a movie
title, punctuation or a function word, or something else, and the share of each kind per
group with Wilson intervals.

The rules, applied to the decoded top-1 token ``t`` (the examples table's ``top{k}_tokens``
list, first entry) in this order:

1. ``actor`` / ``title`` / ``actor_or_title``: ``t`` starts a new word (its first character
   is whitespace: every test prompt ends in a word without a trailing space, so a token
   without one would continue that word) and ``t`` with its leading whitespace stripped is
   a non-empty, case-sensitive prefix of one of the names given (any actor, first or
   second, of the dataset; any movie title). A sub-word prefix counts (``" Ke"`` starts
   ``"Keanu Reeves"``); the prefix may run into the name's second word (``" Tom H"``).
   A token that starts both an actor and a title is ``actor_or_title``.
2. ``punct_function``: ``t`` is only whitespace (a newline), or every character of the
   stripped ``t`` is Unicode punctuation or a symbol (categories ``P*``, ``S*``), or ``t``
   starts a new word and its stripped, lower-cased text is one of :data:`FUNCTION_WORDS`.
   Rule 1 comes first: ``" The"`` is a title when a title of the dataset starts with "The".
3. ``other``: everything else (a lower-case content word, a word continuation, a digit).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence

import polars as pl

from graft.errors import ResultsError
from graft.results.stats.intervals import wilson_interval

#: The kinds, in the order tables list them.
KINDS: tuple[str, ...] = ("actor", "title", "actor_or_title", "punct_function", "other")

#: Function words (matched lower-cased, as a whole word): articles, the prepositions and
#: conjunctions of the test templates and their near relatives, pronouns, auxiliaries.
FUNCTION_WORDS: frozenset[str] = frozenset(
    [
        "a",
        "an",
        "the",
        "and",
        "or",
        "but",
        "nor",
        "of",
        "in",
        "on",
        "at",
        "to",
        "for",
        "with",
        "by",
        "from",
        "as",
        "into",
        "about",
        "alongside",
        "than",
        "is",
        "was",
        "are",
        "were",
        "be",
        "been",
        "has",
        "have",
        "had",
        "his",
        "her",
        "their",
        "its",
        "he",
        "she",
        "it",
        "they",
        "him",
        "them",
        "this",
        "that",
        "these",
        "those",
        "who",
        "whom",
        "which",
        "what",
        "also",
        "both",
        "not",
    ]
)

_TOKENS_COLUMN = re.compile(r"top\d+_tokens")


def _prefixes(names: Iterable[str]) -> set[str]:
    return {name[:i] for name in names for i in range(1, len(name) + 1)}


def _punctuation(text: str) -> bool:
    return all(unicodedata.category(c)[0] in "PS" for c in text)


class Top1Classifier:
    """Classifies decoded tokens by the rules of this module's docstring.

    Args:
        actors: every actor name of the dataset (first and second actors).
        titles: every movie title of the dataset.
    """

    def __init__(self, actors: Iterable[str], titles: Iterable[str]) -> None:
        self._actor_prefixes = _prefixes(actors)
        self._title_prefixes = _prefixes(titles)

    def kind(self, token: str) -> str:
        """The kind of one decoded token (one of :data:`KINDS`)."""
        word = token.lstrip()
        new_word = word != token
        if new_word and word:
            actor, title = word in self._actor_prefixes, word in self._title_prefixes
            if actor or title:
                return "actor_or_title" if actor and title else ("actor" if actor else "title")
        stripped = word.rstrip()
        if not stripped or _punctuation(stripped):
            return "punct_function"
        if new_word and stripped.lower() in FUNCTION_WORDS:
            return "punct_function"
        return "other"


def _tokens_column(examples: pl.DataFrame) -> str:
    found = [c for c in examples.columns if _TOKENS_COLUMN.fullmatch(c)]
    if len(found) != 1:
        raise ResultsError(
            f"top-1 kinds need one decoded top-token column (top<k>_tokens) in the examples, "
            f"found {found or 'none'}; run with a tokenizer so the top tokens are decoded"
        )
    return found[0]


def top1_kinds(
    examples: pl.DataFrame,
    actors: Iterable[str],
    titles: Iterable[str],
    by: Sequence[str] = ("template", "graft"),
    level: float = 0.95,
) -> pl.DataFrame:
    """Counts and shares of each kind of top-1 token per group of ``examples``.

    Args:
        examples: per-(example, graft) rows with a decoded ``top{k}_tokens`` column.
        actors: every actor name of the dataset the prompts come from.
        titles: every movie title of that dataset.
        by: the group columns, listed in the order groups first appear.
        level: coverage of the Wilson intervals.

    Returns:
        One row per group and kind (every kind of :data:`KINDS`, zeros included): the ``by``
        columns, ``kind``, ``count``, ``n`` (rows of the group), ``share`` (count / n),
        ``share_lo``, ``share_hi`` (Wilson) and ``share_ci_method``.
    """
    missing = [c for c in by if c not in examples.columns]
    if missing:
        raise ResultsError(f"top-1 kinds group by columns the examples lack: {missing}")
    classify = Top1Classifier(actors, titles).kind
    column = _tokens_column(examples)
    kinds = examples.select(
        *by, pl.col(column).list.first().map_elements(classify, return_dtype=pl.Utf8).alias("kind")
    )
    groups = (
        kinds.group_by(list(by), maintain_order=True)
        .agg(pl.len().alias("n"), *[(pl.col("kind") == k).sum().alias(k) for k in KINDS])
        .with_row_index("_group")
    )
    order = {k: i for i, k in enumerate(KINDS)}
    long = (
        groups.unpivot(KINDS, index=["_group", *by, "n"], variable_name="kind", value_name="count")
        .sort(["_group", pl.col("kind").replace_strict(order, return_dtype=pl.Int64)])
        .drop("_group")
    )
    intervals = [
        wilson_interval(k, n, level) for k, n in zip(long["count"], long["n"], strict=True)
    ]
    return long.select(
        *by,
        "kind",
        pl.col("count").cast(pl.Int64),
        pl.col("n").cast(pl.Int64),
        (pl.col("count") / pl.col("n")).alias("share"),
        pl.Series("share_lo", [i.lo for i in intervals], dtype=pl.Float64),
        pl.Series("share_hi", [i.hi for i in intervals], dtype=pl.Float64),
        pl.lit("wilson").alias("share_ci_method"),
    )


def top1_kinds_wide(table: pl.DataFrame, by: Sequence[str] = ("template", "graft")) -> pl.DataFrame:
    """The table of :func:`top1_kinds` with one row per group and one ``"share (count)"``
    text column per kind, for printing."""
    cells = table.with_columns(
        pl.format("{} ({})", pl.col("share").round(2), pl.col("count")).alias("cell")
    )
    return cells.pivot("kind", index=[*by, "n"], values="cell", maintain_order=True)
