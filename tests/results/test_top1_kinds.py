"""What kind of token a graft predicts (graft.results.top1_kinds): the rules on hand-made
tokens, and the per-group counts, shares and Wilson intervals on a hand-made table."""

from __future__ import annotations

import polars as pl
import pytest
from statsmodels.stats.proportion import proportion_confint

from graft.errors import ResultsError
from graft.results.top1_kinds import KINDS, Top1Classifier, top1_kinds, top1_kinds_wide

ACTORS = ["Tom Hanks", "Keanu Reeves", "Jodie Foster"]
TITLES = ["The Silent Harbor", "Tomorrow's Echo", "Jade Crown"]


@pytest.mark.parametrize(
    ("token", "kind"),
    [
        (" Tom", "actor_or_title"),  # starts "Tom Hanks" and "Tomorrow's Echo"
        (" Ke", "actor"),  # a sub-word prefix of a first name
        (" Keanu", "actor"),
        (" Keanu Re", "actor"),  # runs into the second word
        (" Jodie", "actor"),
        (" J", "actor_or_title"),  # Jodie Foster, Jade Crown
        (" Jade", "title"),
        (" Tomorrow", "title"),
        (" The", "title"),  # a title starts with it: rule 1 before the function words
        (" Hanks", "other"),  # a surname: not the start of a name
        ("Tom", "other"),  # no leading space: it would continue the prompt's last word
        (" tom", "other"),  # case-sensitive
        (" Tommy", "other"),  # longer than every name it could start
        (" the", "punct_function"),
        (" A", "punct_function"),
        (" with", "punct_function"),
        ("with", "other"),  # a function word must start a new word
        (",", "punct_function"),
        (" .", "punct_function"),
        ('."', "punct_function"),
        ("\n", "punct_function"),  # whitespace only
        (" $", "punct_function"),  # a symbol
        (" 1999", "other"),
        (" movie", "other"),
        ("", "punct_function"),
    ],
)
def test_kind_of_hand_made_tokens(token, kind):
    assert Top1Classifier(ACTORS, TITLES).kind(token) == kind


def examples() -> pl.DataFrame:
    top1 = [" Tom", " Ke", ",", " the", " movie", " Jade", " Jade", "\n", " Ke"]
    return pl.DataFrame(
        {
            "template": ["qa"] * 5 + ["movie"] * 4,
            "graft": ["LT", "LT", "LT", "FE", "FE", "LT", "LT", "LT", "LT"],
            "top10_tokens": [[t, " x"] for t in top1],
        }
    )


def test_counts_shares_and_wilson_intervals():
    table = top1_kinds(examples(), ACTORS, TITLES)
    assert table.columns == [
        "template",
        "graft",
        "kind",
        "count",
        "n",
        "share",
        "share_lo",
        "share_hi",
        "share_ci_method",
    ]
    # groups in order of first appearance, every kind listed (zeros too)
    assert table.select("template", "graft").unique(maintain_order=True).rows() == [
        ("qa", "LT"),
        ("qa", "FE"),
        ("movie", "LT"),
    ]
    assert table["kind"].to_list() == list(KINDS) * 3
    counts = {(r["template"], r["graft"], r["kind"]): r["count"] for r in table.to_dicts()}
    # worked out by hand from the tokens above
    assert [counts["qa", "LT", k] for k in KINDS] == [1, 0, 1, 1, 0]
    assert [counts["qa", "FE", k] for k in KINDS] == [0, 0, 0, 1, 1]
    assert [counts["movie", "LT", k] for k in KINDS] == [1, 2, 0, 1, 0]
    assert table.group_by("template", "graft").agg(pl.col("share").sum())["share"].to_list() == (
        pytest.approx([1.0, 1.0, 1.0])
    )
    row = table.filter(template="movie", graft="LT", kind="title").row(0, named=True)
    assert row["n"] == 4 and row["share"] == 0.5
    lo, hi = proportion_confint(2, 4, alpha=0.05, method="wilson")
    assert (row["share_lo"], row["share_hi"]) == pytest.approx((lo, hi))
    zero = table.filter(template="qa", graft="FE", kind="actor").row(0, named=True)
    assert zero["share_lo"] == 0.0 and zero["share_hi"] > 0.5
    wide = top1_kinds_wide(table)
    assert wide.columns == ["template", "graft", "n", *KINDS]
    assert wide.row(2) == (
        "movie",
        "LT",
        4,
        "0.25 (1)",
        "0.5 (2)",
        "0.0 (0)",
        "0.25 (1)",
        "0.0 (0)",
    )


def test_without_decoded_tokens_it_says_what_is_missing():
    with pytest.raises(ResultsError, match="top<k>_tokens.*tokenizer"):
        top1_kinds(examples().drop("top10_tokens"), ACTORS, TITLES)
    with pytest.raises(ResultsError, match="lack.*data_seed"):
        top1_kinds(examples(), ACTORS, TITLES, by=["data_seed", "graft"])
