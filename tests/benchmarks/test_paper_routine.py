"""The benchmarks' paper routine (token by token, weights loaded into a model copy) vs the engine."""

from __future__ import annotations

import pytest
import torch

from benchmarks._graft_api import GraftRow, parse_spec, run_grafts
from benchmarks.paper_routine import fused_features, paper_rows

SPECS = ("FE+LT:all:all", "LT:q4:o,ffn", "LT:all:q", "FE+LT:all:all; head=paper")


def _rows(spec_text: str, n: int = 3, length: int = 9) -> list[GraftRow]:
    g = torch.Generator().manual_seed(7)
    spec = parse_spec(spec_text)
    return [
        GraftRow(torch.randint(3, 96, (length - i,), generator=g).tolist(), {"FE": [1, 2]}, spec)
        for i in range(n)
    ]


@pytest.mark.parametrize("family", ["llama", "gpt2", "gpt_neox"])
@pytest.mark.parametrize("spec", SPECS)
def test_paper_routine_equals_engine(tiny_pairs, family, spec):
    base, donor = tiny_pairs(family)
    rows = _rows(spec)
    engine = run_grafts(base, {"sft": donor}, rows, batch_size=len(rows))
    paper = paper_rows(base, {"sft": donor}, rows)
    plain = run_grafts(base, {"sft": donor}, _rows("none"), batch_size=len(rows))
    assert (engine - plain).abs().max() > 1e-3  # the graft changes the logits
    assert (paper - engine).abs().max() <= 1e-5


def test_fused_features_pick_each_heads_slice():
    # 2 heads of head_dim 2: features [h0 q q k k v v | h1 q q k k v v]
    assert fused_features("heads", "k", 12, 2).tolist() == [2, 3, 8, 9]
    assert fused_features("thirds", "v", 12, 2).tolist() == [8, 9, 10, 11]
