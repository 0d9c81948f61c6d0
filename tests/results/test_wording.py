"""Verdicts as data (graft.results.stats.verdict) and their one renderer
(graft.results.stats.wording): every rule has a code, the numbers it read, a full reason
and a short phrase for a table cell."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from graft.results.stats import wording
from graft.results.stats.agreement import binomial_agreement, interval_agreement
from graft.results.stats.paired_agreement import mcnemar_agreement, mcnemar_range_agreement
from graft.results.stats.verdict import VERDICTS, Agreement, Floor, Reason, TwoSided

# one verdict per rule: (call, code, verdict)
CASES = [
    (lambda: binomial_agreement(265, 500, 0.53), "equivalent", "agrees"),
    (lambda: binomial_agreement(6, 50, 0.63), "different", "disagrees"),
    (lambda: binomial_agreement(3, 5, 0.53), "too_wide", "undecided"),
    (lambda: interval_agreement(0.9, (0.0, 0.5), (0.05, 0.45)), "wide_but_different", "disagrees"),
    (lambda: interval_agreement(0.29, (0.12, 0.30), (0.14, 0.28)), "neither", "undecided"),
    (lambda: mcnemar_agreement(1.0, (0, 0, 0, 150)), "floor", "undecided"),
    (lambda: mcnemar_agreement(1.0, (150, 0, 0, 0)), "ceiling", "undecided"),
    (lambda: mcnemar_agreement(1.0, (2, 1, 1, 146)), "near_floor", "undecided"),
    (lambda: mcnemar_agreement(1.0, (4, 2, 1, 43)), "exact_short", "undecided"),
    (lambda: mcnemar_agreement(6e-5, (0, 0, 15, 135)), "different", "disagrees"),
    (lambda: mcnemar_range_agreement(140, 141, 150), "pairings_equivalent", "agrees"),
    (lambda: mcnemar_range_agreement(20, 80, 150), "pairings_different", "disagrees"),
    (lambda: mcnemar_range_agreement(3, 7, 10), "pairings_too_wide", "undecided"),
    (lambda: mcnemar_range_agreement(24, 23, 50), "pairings_neither", "undecided"),
    (lambda: mcnemar_range_agreement(30, 20, 50), "pairings_split", "undecided"),
]


@pytest.mark.parametrize(("make", "code", "verdict"), CASES)
def test_each_rule_is_a_code_with_a_reason_and_a_short_phrase(make, code, verdict):
    a = make()
    assert (a.code, a.verdict) == (code, verdict), wording.reason_text(a)
    assert wording.reason_text(a) and wording.test_text(a)
    assert 0 < len(wording.short_text(a)) <= 150, wording.short_text(a)


def test_every_code_is_covered():
    assert {code for _, code, _ in CASES} == set(typing.get_args(Reason))


def test_the_data_hold_the_numbers_the_words_quote():
    a = mcnemar_agreement(1.0, (4, 2, 1, 43))
    assert a.discordant == (2, 1, 50) and a.two_sided == TwoSided("mcnemar", False)
    assert "with 2 and 1 discordant of 50" in wording.reason_text(a)
    assert f"{a.p_equivalence:.2g}" in wording.short_text(a)
    floor = mcnemar_agreement(1.0, (0, 0, 0, 150))
    assert floor.floor == Floor("floor", 0, 0, 150)
    assert wording.reason_text(floor) == wording.floor_text(floor.floor)
    split = mcnemar_range_agreement(30, 20, 50)
    assert len(split.pairing_verdicts) > 1 and set(split.pairing_verdicts) <= set(VERDICTS)
    assert " or ".join(split.pairing_verdicts) in wording.reason_text(split)


def test_a_difference_found_on_the_floor_keeps_its_rule_and_notes_the_floor():
    a = mcnemar_agreement(6e-5, (0, 0, 15, 135), margin=0.10)
    assert a.floor == Floor("near_floor", 0, 15, 150, 0.10)
    assert wording.reason_text(a).endswith(
        "(both within 0.10 of the floor (0/150 and 15/150), but A and B differ)"
    )
    assert wording.short_text(a).endswith("at the floor")


def test_the_words_follow_the_data_not_the_other_way_round():
    # changing a number of the data changes the words: nothing is cached as text
    a = binomial_agreement(265, 500, 0.53)
    moved = dataclasses.replace(a, lo_tost=0.40, hi_tost=0.61)
    assert "[0.40, 0.61]" in wording.reason_text(moved) and "[0.40, 0.61]" in wording.short_text(
        moved
    )
    assert "reason" not in {f.name for f in dataclasses.fields(Agreement)}


def test_the_seed_level_test_and_holm_family_are_named():
    a = mcnemar_agreement(0.099, (100, 5, 20, 25), seed_diffs=[-0.06, -0.10, -0.14], family="F")
    assert "seed-level t test (both must reject), Holm over F" in wording.test_text(a)
    assert "McNemar and seed-level t test p = 0.099 (Holm)" in wording.short_text(a)
