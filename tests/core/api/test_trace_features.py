"""What graft.trace adds for nnsight users (graft.core.api.grafted_trace,
graft.core.api.trace_invokes): gradients through a graft (checked against plain nnsight and against
finite differences), several invokes with their own grafts, attention probabilities, results after
the block, and errors that name graft's part."""

from __future__ import annotations

import copy
import types

import nnsight
import pytest
import torch

from graft.core.api.grafted_trace import trace
from graft.core.api.texts import graft_texts
from graft.core.families.arch import architecture_of
from graft.core.families.wrapping import wrap
from graft.errors import TraceError
from graft.models import tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT = "Keanu Reeves starred in a movie with"
OTHER = "Tom Hanks acted in"
FIELDS = {"FE": "Keanu Reeves"}
TARGET = 5  # the token whose logit the gradient tests differentiate
LAYER = 1


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def layer(envoy, base, index: int = LAYER):
    return envoy.get(f"{architecture_of(base).table.layers_path}.{index}")


def hidden(output):
    return output[0] if isinstance(output, tuple) else output


# ----------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3"])
def test_grad_of_a_graft_of_nothing_is_plain_nnsights(tiny_pairs, tok, family):
    base, donor = tiny_pairs(family)
    with trace(base, {"sft": donor}, tok, TEXT, "none", grad=True) as g:
        h = hidden(layer(g.model, base).output)
        with g.logits[0, TARGET].backward():
            got = h.grad.save()
    envoy = wrap(base)
    with envoy.trace(**g.inputs):
        h = hidden(layer(envoy, base).output)
        with envoy.output.logits[0, -1, TARGET].backward():
            want = h.grad.save()
    assert torch.equal(got, want)


def _metric_with_push(base, donor, tok, spec, direction, eps):
    """The target logit when ``eps * direction`` is added to the layer's output."""
    with trace(base, {"sft": donor}, tok, TEXT, spec, fields=FIELDS) as g:
        out = layer(g.model, base).output
        h = hidden(out)
        h[:] = h + eps * direction
        value = g.logits[0, TARGET].save()
    return float(value)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_grad_through_a_graft_matches_finite_differences(tiny_pairs, tok, family):
    base, donor = tiny_pairs(family)
    spec = "FE+LT:all:all"
    with trace(base, {"sft": donor}, tok, TEXT, spec, fields=FIELDS, grad=True) as g:
        h = hidden(layer(g.model, base).output)
        with g.logits[0, TARGET].backward():
            grad = h.grad.save()
    direction = torch.randn(grad.shape, generator=torch.Generator().manual_seed(0))
    eps = 1e-2
    up = _metric_with_push(base, donor, tok, spec, direction, eps)
    down = _metric_with_push(base, donor, tok, spec, direction, -eps)
    finite = (up - down) / (2 * eps)
    analytic = float((grad * direction).sum())
    assert abs(analytic) > 1e-1  # a derivative that a wrong gradient could not match by chance
    assert abs(finite - analytic) <= 2e-2 * abs(analytic)


def test_attribution_patching_recipe(tiny_pairs, tok):
    """docs/reference/trace.md's recipe: the effect of giving the grafted run the donor's layer output
    at LT, estimated as grad x (donor - grafted); checked against finite differences along
    that difference (patching a small fraction of it)."""
    base, donor = tiny_pairs("llama")
    spec = "FE:all:all"
    with trace(base, {"sft": donor}, tok, TEXT, spec, fields=FIELDS, grad=True) as g:
        h = hidden(layer(g.model, base).output)
        with g.logits[0, TARGET].backward():
            grad = h.grad.save()
        h_graft = h.detach().save()
    with trace(base, {"sft": donor}, tok, TEXT, "ALL:all:all", fields=FIELDS) as g:
        h_donor = hidden(layer(g.model, base).output).save()
    diff = torch.zeros_like(h_graft)
    diff[:, -1] = h_donor[:, -1] - h_graft[:, -1]  # LT only
    attribution = float((grad * diff).sum())
    alpha = 1e-2
    up = _metric_with_push(base, donor, tok, spec, diff, alpha)
    down = _metric_with_push(base, donor, tok, spec, diff, -alpha)
    finite = (up - down) / (2 * alpha)
    assert abs(attribution) > 1e-3  # not zero: a zero or sign-flipped estimate must fail
    assert abs(finite - attribution) <= 2e-2 * abs(attribution)


def test_without_grad_the_trace_keeps_no_graph(tiny_pairs, tok):
    base, donor = tiny_pairs("llama")
    with trace(base, {"sft": donor}, tok, TEXT, "LT:all:all") as g:
        logits = g.logits.save()
    assert not logits.requires_grad


# ------------------------------------------------------------------------------- invokes


@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
def test_invokes_with_their_own_grafts_are_graft_texts_rows(tiny_pairs, tok, family):
    base, donor = tiny_pairs(family)
    with trace(base, {"sft": donor}, tok) as g:
        with g.invoke(TEXT, "none", fields=FIELDS) as row:
            first = row.logits.save()
            spans = nnsight.save(row.spans)
        with g.invoke(OTHER, "FE+LT:all:all", fields={"FE": "Tom Hanks"}) as row:
            second = row.logits.save()
    want = graft_texts(
        base,
        {"sft": donor},
        tok,
        [TEXT, OTHER],
        ["none", "FE+LT:all:all"],
        fields=[FIELDS, {"FE": "Tom Hanks"}],
    )
    assert (first[0] - want[0, 0]).abs().max() <= 1e-5
    assert (second[0] - want[1, 1]).abs().max() <= 1e-5
    assert torch.equal(g.logits, torch.cat([first, second]))  # readable after the block
    assert "FE" in spans and len(spans["LT"]) == 1


def test_a_write_in_one_invoke_changes_its_row_only(tiny_pairs, tok):
    base, donor = tiny_pairs("llama")
    with trace(base, {"sft": donor}, tok) as g:
        with g.invoke(TEXT, "LT:all:all", fields=FIELDS):
            out = layer(g.model, base).output
            hidden(out)[:] = 0
        with g.invoke(TEXT, "LT:all:all", fields=FIELDS):
            pass
    zeroed, untouched = g.logits
    want = graft_texts(base, {"sft": donor}, tok, TEXT, "LT:all:all", fields=FIELDS)
    assert (untouched - want).abs().max() <= 1e-5
    assert (zeroed - want).abs().max() > 1e-3


def test_one_text_with_several_grafts_is_one_row_each(tiny_pairs, tok):
    base, donor = tiny_pairs("llama")
    specs = ["none", "LT:all:all", "FE:all:attn"]
    with trace(base, {"sft": donor}, tok, TEXT, specs, fields=FIELDS) as g:
        logits = g.logits.save()
    want = graft_texts(base, {"sft": donor}, tok, TEXT, specs, fields=FIELDS)
    assert logits.shape[0] == 3 and (logits - want).abs().max() <= 1e-5


@pytest.mark.parametrize(
    ("text", "spec"), [([TEXT, OTHER], "none"), (TEXT, ["none", "LT:all:all"])]
)
def test_an_invoke_is_one_row(tiny_pairs, tok, text, spec):
    """A list given to g.invoke was cut to its first item without a word."""
    base, donor = tiny_pairs("llama")
    g = trace(base, {"sft": donor}, tok)
    with pytest.raises(TraceError, match="one invoke per row"):
        g.invoke(text, spec)


def test_an_invoke_of_token_ids_is_the_texts_row(tiny_pairs, tok):
    base, donor = tiny_pairs("llama")
    rows = []
    for prompt in (TEXT, tok(TEXT)["input_ids"], torch.tensor(tok(TEXT)["input_ids"])):
        with trace(base, {"sft": donor}, tok) as g:  # noqa: SIM117 - nnsight reads its own with
            with g.invoke(prompt, "LT:all:all") as row:
                logits = row.logits.save()
        rows.append(logits)
    assert torch.equal(rows[1], rows[0]) and torch.equal(rows[2], rows[0])


def test_an_empty_invoke_says_what_graft_s_invoke_takes(tiny_pairs, tok):
    """nnsight's empty invoke (the whole batch) was a bare TypeError."""
    base, donor = tiny_pairs("llama")
    with pytest.raises(TraceError, match=r"g.invoke\(\) needs its row's prompt"):  # noqa: SIM117 - nnsight reads its own with
        with trace(base, {"sft": donor}, tok) as g:
            with g.invoke():
                pass


def test_a_backward_without_grad_true_says_so(tiny_pairs, tok):
    base, donor = tiny_pairs("llama")
    with pytest.raises(TraceError, match=r"graft.trace\(\.\.\., grad=True\)") as info:  # noqa: SIM117 - nnsight reads its own with
        with trace(base, {"sft": donor}, tok, TEXT, "LT:all:all") as g:
            h = hidden(layer(g.model, base).output)
            with g.logits[0, TARGET].backward():
                h.grad.save()
    assert "\n" not in str(info.value)
    with pytest.raises(TraceError, match="grad=True"):  # noqa: SIM117 - nnsight reads its own with
        with trace(base, {"sft": donor}, tok, TEXT, "LT:all:all") as g:
            g.logits[0, TARGET].backward()
    with trace(base, {"sft": donor}, tok, TEXT, "LT:all:all", grad=True) as g:  # the fix works
        h = hidden(layer(g.model, base).output)
        with g.logits[0, TARGET].backward():
            grad = h.grad.save()
    assert grad.abs().sum() > 0


def test_invoke_needs_a_trace_without_texts(tiny_pairs, tok):
    base, donor = tiny_pairs("llama")
    g = trace(base, {"sft": donor}, tok, TEXT, "none")
    with pytest.raises(TraceError, match="without texts"):
        g.invoke(TEXT, "none")


# ----------------------------------------------------------------------------- attention


@pytest.mark.parametrize("family", ["llama", "gpt2", "gpt_neox", "gemma3"])
def test_attention_probabilities_of_a_grafted_run(tiny_pairs, tok, family):
    base, donor = tiny_pairs(family)
    before = base.config._attn_implementation
    texts = [TEXT, OTHER]  # padded: the shorter row's padding columns get no attention
    with trace(base, {"sft": donor}, tok, texts, "LT:all:q,k", attention=True) as g:
        grafted = g.attention(LAYER).save()
    with trace(base, {"sft": donor}, tok, texts, "none", attention=True) as g:
        plain = g.attention(LAYER).save()
    pad = (g.inputs["attention_mask"] == 0).nonzero()
    assert base.config._attn_implementation == before  # put back
    assert torch.allclose(grafted.sum(-1)[:, :, -1], torch.ones(2, grafted.shape[1]))
    for row, col in pad.tolist():
        assert grafted[row, :, -1, col].abs().max() == 0
    assert torch.equal(grafted[:, :, :-1], plain[:, :, :-1])  # q, k grafted at LT only
    assert (grafted[:, :, -1] - plain[:, :, -1]).abs().max() > 1e-4


def test_attention_needs_the_option(tiny_pairs, tok):
    base, donor = tiny_pairs("llama")
    with pytest.raises(TraceError, match="attention=True"):  # noqa: SIM117 - nnsight reads its own with
        with trace(base, {"sft": donor}, tok, TEXT, "none") as g:
            g.attention(0)


# ----------------------------------------------------------------------------- lifecycle


def test_results_after_the_block_and_a_second_entry(tiny_pairs, tok):
    base, donor = tiny_pairs("llama")
    with trace(base, {"sft": donor}, tok, TEXT, "LT:all:all") as g:
        inside = g.logits.save()
    assert torch.equal(g.logits, inside)
    with pytest.raises(TraceError, match="only inside"):
        g.model  # noqa: B018
    with pytest.raises(TraceError, match="already run"):  # noqa: SIM117 - nnsight reads its own with
        with g:
            x = g.logits  # noqa: F841


def test_an_error_in_the_graft_names_graft(tiny_pairs, tok):
    base, donor = tiny_pairs("llama")
    broken = copy.deepcopy(donor)
    down = broken.model.layers[LAYER].mlp.down_proj

    def fail(self, x):
        raise RuntimeError("the donor module failed")

    down.forward = types.MethodType(fail, down)
    with pytest.raises(RuntimeError, match="the donor module failed") as caught:  # noqa: SIM117
        with trace(base, {"sft": broken}, tok, TEXT, "LT:all:all") as g:
            g.logits.save()
    notes = " ".join(getattr(caught.value, "__notes__", []))
    assert f"grafting model.layers.{LAYER}.mlp.down_proj from donor(s) sft" in notes
