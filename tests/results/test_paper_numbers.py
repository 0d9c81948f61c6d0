"""The paper's numbers as data: what the text states, and which paper model a graft model
stands for (graft.results.paper.numbers)."""

from __future__ import annotations

import pytest

from graft.results.paper import numbers as paper_numbers
from graft.results.paper.numbers import PAPER_MODELS, PAPER_NUMBERS, bar_values, lookup


def test_the_numbers_the_issue_names_are_recorded_as_the_text_states_them():
    def value(model, experiment, graft):
        (number,) = lookup(model, experiment, graft, kind=None)
        return number.value, number.kind, number.exact, number.source.split(",")[0]

    assert value("Gemma-1.1-2B", "position", "LT") == (0.53, "value", True, "Fig. 2")
    assert value("Gemma-1.1-2B", "position", "SFT") == (1.0, "value", True, "Fig. 2")
    assert value("GPT2-XL", "position", "FE") == (0.28, "value", True, "Fig. 2")
    o = [n for n in lookup("Gemma-1.1-2B", "component", "O+FFN") if n.kind == "difference"]
    assert [(n.value, n.versus, n.group) for n in o] == [(0.29, "FFN", "reversal")]
    (llama_o,) = lookup("Llama-3.2-1B", "component", "O+FFN", kind="difference")
    assert llama_o.value == 0.41
    assert lookup("Gemma-1.1-2B", "hybrid", "FE ATTN + LT hybrid")[0].value == 0.63
    assert lookup("Llama-3.2-1B", "hybrid", "FE ATTN + LT hybrid")[0].value == 0.34
    # Fig. 2's "≈" statements hold for all four models, with no number
    for model in PAPER_MODELS:
        approx = lookup(model, "position", kind="approx")
        assert {(n.graft, n.versus) for n in approx} == {("FE+LT", "SFT"), ("(FE+LT)^C", "PRE")}
        assert all(n.value is None and not n.exact for n in approx)


def test_every_number_is_well_formed():
    for n in PAPER_NUMBERS:
        assert n.paper_model in PAPER_MODELS and n.source.startswith("Fig. ")
        assert n.template == "headline"  # Figs. 2, 4 and 5 are all on the headline sentence
        assert (n.value is None) == (n.kind == "approx")
        assert (n.versus == "") == (n.kind == "value")
        assert n.value is None or 0 <= n.value <= 1
        assert n.quote
    assert len(set(PAPER_NUMBERS)) == len(PAPER_NUMBERS)


@pytest.mark.parametrize(
    ("model", "paper_model"),
    [
        ("smollm2-135m", "Llama-3.2-1B"),
        ("gemma3-270m", "Gemma-1.1-2B"),
        ("gpt2-xl", "GPT2-XL"),
        ("tiny-llama", None),
        ("/models/my-gemma", None),
    ],
)
def test_graft_models_map_to_the_nearest_paper_model(model, paper_model):
    assert paper_numbers.paper_model_of(model) == paper_model


def test_bar_values_are_the_bar_heights_of_one_figure():
    label = "paper (Gemma-1.1-2B, Fig. 2)"
    assert bar_values("gemma3-270m", "position", "headline") == {
        "LT": (0.53, label),
        "SFT": (1.0, label),
    }
    assert bar_values("gemma3-270m", "position", "qa") == {}
    assert bar_values("smollm2-135m", "position", "headline") == {}  # no Llama bar stated
    assert bar_values("gpt2-xl", "position", "headline") == {
        "FE": (0.28, "paper (GPT2-XL, Fig. 2)")
    }
    # differences are not bar heights
    assert bar_values("gemma3-270m", "component", "headline", "reversal") == {}
    assert bar_values("tiny-gemma", "position", "headline") == {}
