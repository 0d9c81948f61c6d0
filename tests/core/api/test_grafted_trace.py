"""graft.trace (graft.core.api.grafted_trace): the graft as an nnsight trace, on every family.

Grafting nothing is a plain nnsight trace of the base bit for bit; grafting everything with
the donor's head is the donor's own trace; the last-position logits are graft_texts' and
the token-by-token reference's; a user's read of a grafted output sees the graft and a
user's write lands after it.
"""

from __future__ import annotations

import nnsight
import pytest
import torch

import graft
from graft.core.api.grafted_trace import trace
from graft.core.api.texts import graft_texts
from graft.core.execution.trace import graft_trace_body, last_logits
from graft.core.families.arch import architecture_of
from graft.core.families.wrapping import wrap
from graft.core.language.spec import EMBEDDING_COMPONENTS
from graft.errors import SpecError
from graft.models import tiny_tokenizer
from graft.models.tiny import TINY_FAMILIES
from tests.reference import reference_last_logits

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = 1e-5  # the engine's float32 bound
TEXTS = ["Keanu Reeves starred in a movie with", "Tom Hanks acted in"]  # two lengths: padded
FIELDS = [{"FE": "Keanu Reeves"}, {"FE": "Tom Hanks"}]
LAYER = 2  # the layer whose MLP the write tests zero (of the tiny models' 4)


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def layer_paths(base) -> list[str]:
    arch = architecture_of(base)
    return [f"{arch.table.layers_path}.{i}" for i in range(arch.n_layers)]


def hidden(output):
    """A decoder layer's hidden states (some families' layers return a tuple)."""
    return output[0] if isinstance(output, tuple) else output


def plain_layer_outputs(model, inputs, paths) -> list[torch.Tensor]:
    """Every layer's output in a plain nnsight trace of ``model`` on ``inputs``."""
    envoy = wrap(model)
    with torch.no_grad(), envoy.trace(**inputs):
        outs = nnsight.save([envoy.get(p).output for p in paths])
    return [hidden(o) for o in outs]


def grafted_layer_outputs(base, donor, tok, spec, paths, read_logits):
    """A graft trace of ``spec`` on TEXTS: the trace, every layer's output and the logits
    ``read_logits(trace)`` reads, saved."""
    with trace(base, {"sft": donor}, tok, TEXTS, spec) as g:
        outs = nnsight.save([g.model.get(p).output for p in paths])
        logits = read_logits(g).save()
    return g, outs, logits


def mlp_path(base, layer: int) -> str:
    """The MLP module of ``layer`` (the parent of its ``down`` projection)."""
    return architecture_of(base).site_for(layer, "down")[0].rsplit(".", 1)[0]


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_grafting_nothing_is_a_plain_trace_bit_for_bit(tiny_pairs, tok, family):
    base, donor = tiny_pairs(family)
    paths = layer_paths(base)
    g, outs, logits = grafted_layer_outputs(
        base, donor, tok, "none", paths, lambda g: g.model.output.logits
    )
    plain = plain_layer_outputs(base, g.inputs, paths)
    for path, got, want in zip(paths, outs, plain, strict=True):
        assert torch.equal(hidden(got), want), path
    with torch.no_grad():
        assert torch.equal(logits, base(**g.inputs).logits)


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_grafting_everything_with_the_donor_head_is_the_donors_trace(tiny_pairs, tok, family):
    base, donor = tiny_pairs(family)
    paths = layer_paths(base)
    g, outs, logits = grafted_layer_outputs(
        base, donor, tok, "ALL:all:all; head=donor", paths, lambda g: g.logits
    )
    want = plain_layer_outputs(donor, g.inputs, paths)
    of_base = plain_layer_outputs(base, g.inputs, paths)
    real = g.inputs["attention_mask"].bool()  # padded positions are masked: not compared
    for path, got, d, b in zip(paths, outs, want, of_base, strict=True):
        assert (hidden(got) - d)[real].abs().max() <= TOL, path
        assert (hidden(got) - b)[real].abs().max() > 1e-3, path  # not the base's
    with torch.no_grad():
        donor_last = torch.stack(
            [donor(tok(t, return_tensors="pt").input_ids).logits[0, -1] for t in TEXTS]
        )
    assert (logits - donor_last).abs().max() <= TOL


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_logits_are_graft_texts_and_the_reference(tiny_pairs, tok, family):
    base, donor = tiny_pairs(family)
    specs = ["FE+LT:all:all", "LT:h2:o,ffn"]  # one spec per text
    with trace(base, {"sft": donor}, tok, TEXTS, specs, fields=FIELDS) as g:
        logits = g.logits.save()
    assert logits.shape == (2, base.config.vocab_size)
    every = graft_texts(base, {"sft": donor}, tok, TEXTS, specs, fields=FIELDS)
    assert (logits - torch.stack([every[0, 0], every[1, 1]])).abs().max() <= TOL
    arch = architecture_of(base)
    for i, (text, spec) in enumerate(zip(TEXTS, specs, strict=True)):
        ids = tok(text).input_ids
        offset = g.spans[i]["LT"][0] - (len(ids) - 1)
        spans = {"FE": [p - offset for p in g.spans[i]["FE"]]}
        res = graft.parse_spec(spec).resolve(arch, len(ids), spans)
        ref = reference_last_logits(
            base, {"sft": donor}, ids, res.cells, res.final_norm_donor, res.unembed_donor
        )
        assert (logits[i] - ref).abs().max() <= TOL, spec


def test_spans_are_positions_in_the_padded_batch(tiny_pairs, tok):
    base, donor = tiny_pairs("llama")
    g = trace(base, donor, tok, TEXTS, "FE+LT:all:all", fields=FIELDS)
    ids = g.inputs["input_ids"]
    width = ids.shape[1]
    for i, named in enumerate(FIELDS):
        assert g.spans[i]["LT"] == [width - 1]  # left padding: every row ends at -1
        fe = tok.decode(ids[i, g.spans[i]["FE"]])  # the tiny tokenizer lower-cases
        assert fe.strip() == named["FE"].lower()


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_a_read_of_a_grafted_output_sees_the_graft(tiny_pairs, tok, family):
    base, donor = tiny_pairs(family)
    path = architecture_of(base).site_for(LAYER, "down")[0]
    with trace(base, {"sft": donor}, tok, TEXTS, "LT:all:all") as g:
        x = g.model.get(path).input.save()
        y = g.model.get(path).output.clone().save()  # a copy as served, not the live tensor
    with torch.no_grad():
        donor_y = donor.get_submodule(path)(x[:, -1].contiguous())
        base_y = base.get_submodule(path)(x[:, :-1].contiguous())
    assert (y[:, -1] - donor_y).abs().max() <= TOL  # the donor's cells at LT
    assert (y[:, :-1] - base_y).abs().max() <= TOL  # the base's elsewhere
    assert (y[:, -1] - base.get_submodule(path)(x[:, -1].contiguous())).abs().max() > 1e-4


@pytest.mark.parametrize("where", ["mlp", "down"])
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_a_write_lands_after_the_graft(tiny_pairs, tok, family, where):
    """Zeroing a grafted MLP (or its grafted down projection itself) at LT equals grafting,
    then zeroing by hand in a plain trace, and equals a graft that leaves that MLP's cells
    to the base (zeroed, they no longer matter)."""
    base, donor = tiny_pairs(family)
    down = architecture_of(base).site_for(LAYER, "down")[0]
    target = mlp_path(base, LAYER) if where == "mlp" else down
    spec = "FE+LT:all:all"

    def zeroed(spec_text: str, zero: bool = True) -> torch.Tensor:
        with trace(base, {"sft": donor}, tok, TEXTS, spec_text, fields=FIELDS) as g:
            if zero:
                g.model.get(target).output[:, -1] = 0
            logits = g.logits.save()
        return logits

    got = zeroed(spec)
    # by hand: the graft's own patches up to the target, the zeroing, then the rest
    g = trace(base, {"sft": donor}, tok, TEXTS, spec, fields=FIELDS)
    patches, mods, batch = g.batch.patches, g.donor_modules, g.batch
    inside = [
        i for i, p in enumerate(patches) if p.path == target or p.path.startswith(target + ".")
    ]
    cut = max(inside) + 1
    model = wrap(base)
    with torch.no_grad(), model.trace(**g.inputs):
        graft_trace_body(model, patches[:cut], mods)
        model.get(target).output[:, -1] = 0
        graft_trace_body(model, patches[cut:], mods)
        by_hand = last_logits(model.output.logits, batch).save()
    assert torch.equal(got, by_hand)
    # the same graft with that MLP's cells at LT left to the base: equal once zeroed
    arch = architecture_of(base)
    others = [i for i in range(arch.n_layers) if i != LAYER]
    kept = [c for c in arch.components if c not in EMBEDDING_COMPONENTS + ("gate", "up", "down")]
    without = (
        f"FE+LT:{','.join(map(str, others))}:all; FE:{LAYER}:block; LT:{LAYER}:{','.join(kept)}"
    )
    assert (got - zeroed(without)).abs().max() <= TOL
    # ... and only once zeroed: unzeroed, that MLP's cells matter
    assert (zeroed(spec, zero=False) - zeroed(without, zero=False)).abs().max() > 1e-3


def test_an_in_place_write_to_a_grafted_input_reaches_the_donor(tiny_pairs, tok):
    base, donor = tiny_pairs("llama")
    path = architecture_of(base).site_for(LAYER, "down")[0]
    with trace(base, {"sft": donor}, tok, TEXTS, "LT:all:all") as g:
        g.model.get(path).input[:, -1] = 1.0
        y = g.model.get(path).output.save()
    with torch.no_grad():
        want = donor.get_submodule(path)(torch.ones(2, 64))
    assert (y[:, -1] - want).abs().max() <= TOL


def test_stop_cache_and_skip(tiny_pairs, tok):
    base, donor = tiny_pairs("llama")
    path = architecture_of(base).site_for(LAYER, "down")[0]
    with trace(base, donor, tok, TEXTS, "LT:all:all") as g:
        cache = g.cache(modules=[g.model.get(path)])
        whole = g.model.get(path).output.clone().save()
    assert torch.equal(cache["model." + path].output, whole)  # a cache sees the graft
    with trace(base, donor, tok, TEXTS, "LT:all:all") as g:
        stopped = g.model.get(path).output.clone().save()
        g.stop()  # the graft's modules past here are never reached: no error
    assert torch.equal(stopped, whole)
    with trace(base, donor, tok, TEXTS, "LT:all:all") as g:
        g.model.get(path).skip(torch.zeros_like(whole))
        skipped = g.model.get(path).output.save()
    # skip replaces the base's computation only: the donor's cells are written over it
    assert skipped[:, :-1].abs().max() == 0
    assert torch.equal(skipped[:, -1], whole[:, -1])


def test_the_trace_leaves_no_gradients_and_frees_the_model(tiny_pairs, tok):
    base, donor = tiny_pairs("llama")
    with trace(base, donor, tok, TEXTS[0], "LT:all:all") as g:
        logits = g.logits.save()
    assert logits.shape == (1, base.config.vocab_size) and not logits.requires_grad
    assert g.envoy is None and not g.donor_modules  # no hold on any weights after the block


@pytest.mark.parametrize(
    ("texts", "specs", "message"),
    [
        (TEXTS, ["LT:all:all"], "one spec per text"),
        (TEXTS, ["LT:all:all"] * 3, "one spec per text"),
        (TEXTS, "XX:all:all", "XX"),
        ([], "LT:all:all", "non-empty list of prompts"),
    ],
)
def test_bad_input_is_one_graft_error(tiny_pairs, tok, texts, specs, message):
    base, donor = tiny_pairs("llama")
    with pytest.raises(SpecError, match=message):
        trace(base, donor, tok, texts, specs)


def test_an_executor_that_cannot_trace_is_refused(tiny_pairs, tok):
    base, donor = tiny_pairs("llama")
    with pytest.raises(SpecError, match="cannot run a trace"):
        trace(base, donor, tok, TEXTS[0], "LT:all:all", executor=object())


def test_graft_trace_is_exported(tiny_pairs, tok):
    assert graft.trace is trace


def test_token_ids_trace_as_their_text(tiny_pairs, tok):
    """Token ids (and a [rows, n] tensor of them) are the text's rows; an nnsight model
    with its own tokenizer gives it."""
    from nnsight.modeling.transformers import TransformersModel

    base, donor = tiny_pairs("llama")
    with trace(base, donor, tok, TEXTS[0], ["none", "LT:all:all"]) as g:
        want = g.logits.save()
    ids = tok(TEXTS[0])["input_ids"]
    with trace(base, donor, tok, ids, ["none", "LT:all:all"]) as g:
        got = g.logits.save()
    assert torch.equal(got, want)
    model = TransformersModel(base, task="text-generation", tokenizer=tok)
    with trace(model, donor, None, torch.tensor([ids, ids]), ["none", "LT:all:all"]) as g:
        rows = g.logits.save()
    assert torch.equal(rows, want)
