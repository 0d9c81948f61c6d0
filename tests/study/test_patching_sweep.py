"""The layer-by-layer patching sweep (graft.study.analyses.patching_sweep, patching_report): the cells
it builds, a one-layer patch against nnsight written here, the all-layer patch against the
donor's own readout, cells identical by construction, and the effect table."""

from __future__ import annotations

import nnsight
import polars as pl
import pytest
import torch

from graft.core.execution.engine import run_grafts
from graft.core.families.arch import architecture_of
from graft.core.families.wrapping import wrap
from graft.core.language.spec import parse_spec
from graft.core.planning.plan import GraftRow, resolve_rows
from graft.errors import SpecError
from graft.models.tiny import TINY_FAMILIES
from graft.results.stats.intervals import wilson_interval
from graft.study.analyses.patching import executor_for
from graft.study.analyses.patching_report import seed_findings, sweep_table
from graft.study.analyses.patching_sweep import (
    copies_donor_stream,
    direction_models,
    identical_by_construction,
    kind_components,
    kind_site,
    layer_windows,
    split_name,
    sweep_grafts,
)

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = 1e-5
NO_START = [40, 41, 42, 43, 44, 45, 46]  # FE at 0..1: nothing before the entity
WITH_START = [1, 40, 41, 42, 43, 44, 45, 46]  # a start token, then FE at 1..2


def logits(base, donor, ids, spans, spec: str, method: str) -> torch.Tensor:
    row = GraftRow(ids, spans, parse_spec(spec))
    return run_grafts(base, {"sft": donor}, [row], executor=executor_for(method))[0]


def resolved(base, ids, spans, spec: str):
    (res,) = resolve_rows(architecture_of(base), [GraftRow(ids, spans, parse_spec(spec))], {"sft"})
    return res


# ------------------------------------------------------------------------ the cells


def test_kinds_split_each_family_at_its_mlp_input_norm(tiny_pairs):
    llama = architecture_of(tiny_pairs("llama")[0])
    assert kind_components(llama, "attn") == ("ln_1", "q", "k", "v", "o")
    assert kind_components(llama, "mlp") == ("ln_2", "gate", "up", "down")
    assert kind_site(llama, "attn") == "o" and kind_site(llama, "mlp") == "down"
    assert kind_site(llama, "residual") == "block"
    gemma = architecture_of(tiny_pairs("gemma3")[0])  # sandwich norms: the block's output
    assert kind_site(gemma, "attn") == "ln_post_attn" and kind_site(gemma, "mlp") == "ln_post_ffn"
    assert kind_components(gemma, "attn")[-1] == "ln_post_attn"
    assert kind_components(gemma, "mlp")[0] == "ln_2"
    gpt2 = architecture_of(tiny_pairs("gpt2")[0])
    assert set(kind_components(gpt2, "residual")) == set(kind_components(gpt2, "attn")) | set(
        kind_components(gpt2, "mlp")
    )


def test_layer_windows_are_centred_and_stay_inside_the_model():
    assert layer_windows(4) == [(0, "0"), (1, "1"), (2, "2"), (3, "3")]
    assert layer_windows(6, 3) == [
        (0, "0-2"),
        (1, "0-2"),
        (2, "1-3"),
        (3, "2-4"),
        (4, "3-5"),
        (5, "3-5"),
    ]
    assert layer_windows(4, 4) == [(c, "0-3") for c in range(4)]
    with pytest.raises(SpecError, match="window width 5"):
        layer_windows(4, 5)


def test_sweep_grafts_name_every_cell_and_point_the_direction_the_right_way(tiny_pairs):
    arch = architecture_of(tiny_pairs("llama")[0])
    restore = sweep_grafts(arch, "weights", direction_models("restore", "one"), ["LT"], 1, ["mlp"])
    names = [(g.group, g.name) for g in restore]
    assert names[:2] == [("", "PRE"), ("", "SFT")]
    assert ("mlp", "LT | L3") in names and ("all layers", "FE+LT") in names
    spec = next(g.spec for g in restore if g.name == "LT | L3")
    assert str(spec) == "LT:3:ln_2,gate,up,down"
    broken = sweep_grafts(arch, "activation", direction_models("break", "one"), ["LT"], 1, ["mlp"])
    assert [g.name for g in broken[:2]] == ["SFT", "PRE"]
    assert str(next(g.spec for g in broken if g.name == "LT | L0")) == "LT:0:down@pre"
    residual = sweep_grafts(arch, "residual", direction_models("restore", "one"), ["LT"], 2)
    assert {g.group for g in residual} == {"", "residual"}  # no whole-depth cells
    assert split_name("FE[-1] | L12") == ("FE[-1]", 12) and split_name("FE+LT") == ("FE+LT", None)


# ---------------------------------------------------------- patching as the field does it


@pytest.mark.parametrize("family", ["llama", "gemma3", "gpt2"])
def test_a_one_layer_residual_patch_is_the_hand_written_nnsight_patch(tiny_pairs, family):
    """``LT:1:block`` by residual patching, as an nnsight user writes it: save the donor's
    layer-1 output, write its last position into the base's run."""
    base, donor = tiny_pairs(family)
    layer = f"{architecture_of(base).table.layers_path}.1"
    ids = torch.tensor([WITH_START])
    with torch.no_grad(), wrap(donor).trace(ids):
        out = wrap(donor).get(layer).output  # a decoder layer's output: a tensor or a tuple
        saved = nnsight.save(out[0] if isinstance(out, tuple) else out)
    with torch.no_grad(), wrap(base).trace(ids):
        out = wrap(base).get(layer).output
        (out[0] if isinstance(out, tuple) else out)[:, -1] = saved[:, -1]
        want = nnsight.save(wrap(base).output.logits[0, -1])
    got = logits(base, donor, WITH_START, {}, "LT:1:block", "residual")
    assert (got - want).abs().max() <= TOL
    assert (got - logits(base, donor, WITH_START, {}, "none", "residual")).abs().max() > 1e-4


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_patching_every_module_at_lt_is_the_donors_stream_through_the_base_head(tiny_pairs, family):
    """The all-layer patch at LT copies the donor's final last-token state: its logits are
    the base's head on it. A sanity check of patching, flagged as one, not a finding."""
    base, donor = tiny_pairs(family)
    arch = architecture_of(base)
    norm = arch.table.final_norm_path
    ids = torch.tensor([WITH_START])
    with torch.no_grad(), wrap(donor).trace(ids):
        stream = nnsight.save(wrap(donor).get(norm).input)
    with torch.no_grad(), wrap(base).trace(ids):
        wrap(base).get(norm).input = stream
        want = nnsight.save(wrap(base).output.logits[0, -1])
    got = logits(base, donor, WITH_START, {}, "LT:all:all", "activation")
    assert (got - want).abs().max() <= TOL
    row = GraftRow(WITH_START, {})
    assert copies_donor_stream(parse_spec("LT:all:all"), "activation", arch, row)
    assert not copies_donor_stream(parse_spec("LT:all:all"), "weights", arch, row)
    assert not copies_donor_stream(parse_spec("LT:all:o,down"), "activation", arch, row)
    last = arch.n_layers - 1
    assert copies_donor_stream(parse_spec(f"LT:{last}:block"), "residual", arch, row)
    assert not copies_donor_stream(parse_spec(f"LT:{last - 1}:block"), "residual", arch, row)
    # grafting the same cells does not copy anything: the donor's weights read the base's
    # earlier positions
    grafted = logits(base, donor, WITH_START, {}, "LT:all:all", "weights")
    assert (grafted - want).abs().max() > 1e-4


@pytest.mark.parametrize("family", ["llama", "gemma3", "gpt2", "gpt_neox"])
def test_identical_by_construction_fires_without_a_start_token_only(tiny_pairs, family):
    base, donor = tiny_pairs(family)
    arch = architecture_of(base)
    fe_first, fe_after = {"FE": [0, 1]}, {"FE": [1, 2]}
    assert identical_by_construction(resolved(base, NO_START, fe_first, "FE:all:all"), arch)
    assert not identical_by_construction(resolved(base, WITH_START, fe_after, "FE:all:all"), arch)
    # when it fires the two methods give the same numbers; when not, they differ
    same = [
        logits(base, donor, NO_START, fe_first, "FE:all:all", m) for m in ("weights", "activation")
    ]
    assert (same[0] - same[1]).abs().max() <= TOL
    apart = [
        logits(base, donor, WITH_START, fe_after, "FE:all:all", m)
        for m in ("weights", "activation")
    ]
    assert (apart[0] - apart[1]).abs().max() > 1e-4
    # a graft that leaves out the embeddings, or one layer, or a position before FE's last,
    # does not qualify; nor does a graft of nothing
    for spec in ("FE:all:block", "FE:1-3:all", "FE[-1]:all:all", "LT:all:all"):
        assert not identical_by_construction(resolved(base, NO_START, fe_first, spec), arch), spec
    assert not identical_by_construction(resolved(base, NO_START, fe_first, "none"), arch)
    assert identical_by_construction(resolved(base, NO_START, fe_first, "0..3:all:all"), arch)


# ------------------------------------------------------------------------- the tables


def test_the_effect_is_zero_at_the_running_model_and_one_at_the_giving_one():
    rows = []
    for i in range(6):
        base_lp, donor_lp = -8.0 - i, -1.0 - i / 2
        for graft, role, lp, layer in (
            ("PRE", "running", base_lp, None),
            ("SFT", "giving", donor_lp, None),
            ("LT | L0", "cell", base_lp, 0),
            ("LT | L1", "cell", donor_lp, 1),
            ("LT | L2", "cell", (base_lp + donor_lp) / 2, 2),
        ):
            rows.append(
                {
                    "direction": "restore",
                    "kind": "" if role != "cell" else "mlp",
                    "unit": "LT" if role == "cell" else graft,
                    "layer": layer,
                    "method": "weights",
                    "role": role,
                    "template": "headline",
                    "prompt_id": str(i),
                    "target_logprob": lp,
                    "hit@5": lp > -4,
                }
            )
    table = sweep_table(pl.DataFrame(rows), n_boot=200).sort("layer")
    assert table["effect"].to_list() == pytest.approx([0.0, 1.0, 0.5])
    assert table["n"].to_list() == [6, 6, 6]
    mid = table.row(2, named=True)
    assert mid["effect_lo"] <= 0.5 <= mid["effect_hi"]
    assert (table["identical"] == 0).all() and (table["sanity"] == 0).all()


def test_a_replicated_cell_is_widened_over_its_seeds():
    # three donors; the cell restores 0.2, 0.5 and 0.8 of the gap on the same six prompts
    rows = []
    for seed, share in ((0, 0.2), (1, 0.5), (2, 0.8)):
        for i in range(6):
            base_lp, donor_lp = -8.0 - i, -1.0 - i / 2
            for graft, role, lp in (
                ("PRE", "running", base_lp),
                ("SFT", "giving", donor_lp),
                ("LT | L3", "cell", base_lp + share * (donor_lp - base_lp)),
            ):
                rows.append(
                    {
                        "direction": "restore",
                        "kind": "" if role != "cell" else "mlp",
                        "unit": "LT" if role == "cell" else graft,
                        "layer": 3 if role == "cell" else None,
                        "method": "weights",
                        "role": role,
                        "template": "headline",
                        "prompt_id": str(i),
                        "finetune_seed": seed,
                        "target_logprob": lp,
                        "hit@5": role != "running" and (seed > 0 or i < 3),
                    }
                )
    [cell] = sweep_table(pl.DataFrame(rows), n_boot=200).iter_rows(named=True)
    assert cell["n"] == 18 and cell["seeds"] == 3
    # each donor's own findings: the layer reaches half the gap under two of the three
    own = seed_findings(pl.DataFrame(rows)).sort("seed")
    assert own["seed"].to_list() == [0, 1, 2]
    assert own["peak_effect"].to_list() == pytest.approx([0.2, 0.5, 0.8])
    assert own["first_layer_half"].to_list() == [None, 3, 3]
    assert seed_findings(pl.DataFrame(rows).filter(pl.col("finetune_seed") == 0)).is_empty()
    assert cell["effect"] == pytest.approx(0.5) and cell["effect_sd"] == pytest.approx(0.3)
    half = 4.302653 * 0.3 / 3**0.5  # Student t, 2 degrees of freedom, 95%
    # every prompt moves by the same share: the bootstrap over rows alone is far too narrow
    assert cell["effect_lo"] == pytest.approx(0.5 - half, abs=1e-4)
    assert cell["effect_hi"] == pytest.approx(0.5 + half, abs=1e-4)
    # acc@5 0.5, 1, 1 over the seeds: wider than the pooled 15 of 18
    pooled = wilson_interval(15, 18)
    assert cell["acc@5"] == pytest.approx(15 / 18)
    assert cell["acc@5_lo"] < pooled.lo and cell["acc@5_hi"] >= pooled.hi
