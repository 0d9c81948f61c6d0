"""Batch plans: the masks built from index lists equal the per-cell marking they replace."""

from __future__ import annotations

import random

import pytest
import torch

from graft.core.families.arch import architecture_of
from graft.core.language.spec import parse_spec
from graft.core.planning import plan as plan_module
from graft.core.planning.plan import GraftRow, SitePatch, plan_batch
from graft.models.tiny import TINY_FAMILIES, tiny_model

POSITIONS = ("FE", "LT", "ALL", "M", "FE+LT", "(FE+LT)^C", "FE^C", "LT^C", "0", "2")
LAYERS = ("all", "q4", "0", "1,3", "0-1")
HEADS = ("", "; head=donor", "; head=donor@task", "; head=paper")


def _reference_patches(arch, resolved, padded) -> list[SitePatch]:
    """The former planning: one tensor write per marked cell (kept here as the reference)."""
    shape = tuple(padded.input_ids.shape)
    entries: dict[tuple[str, str], dict] = {}

    def mark(path, site, donor, comp, row, pos):
        entry = entries.setdefault(
            (path, donor), {"rows": torch.zeros(shape, dtype=torch.bool), "slices": {}}
        )
        entry["rows"][row, pos] = True
        if site is not None and site.fused:
            index = plan_module._SLICE_INDEX[comp]
            entry["slices"].setdefault(index, torch.zeros(shape, dtype=torch.bool))[row, pos] = 1

    for i, res in enumerate(resolved):
        for (layer, comp), cell in res.cells.items():
            path, site = arch.site_for(layer, comp)
            for pos, donor in cell.items():
                mark(path, site, donor, comp, i, pos + padded.offsets[i])
        last = int(padded.last_index[i])
        if res.final_norm_donor:
            mark(arch.table.final_norm_path, None, res.final_norm_donor, None, i, last)
        if res.unembed_donor:
            mark(arch.table.unembed_path, None, res.unembed_donor, None, i, last)
    # the patches in site order, as the planning assembles them from its masks
    return plan_module._patches(arch, entries)


def _random_spec(rng: random.Random, components: tuple[str, ...]):
    rules = []
    for _ in range(rng.randint(1, 3)):
        comps = ",".join(rng.sample(components, rng.randint(1, 3))) if rng.random() < 0.7 else "all"
        donor = rng.choice(("", "", "@task"))
        rules.append(f"{rng.choice(POSITIONS)}:{rng.choice(LAYERS)}:{comps}{donor}")
    if rng.random() < 0.1:
        return parse_spec("none")
    return parse_spec("; ".join(rules) + rng.choice(HEADS))


def _random_rows(rng: random.Random, components, n_rows: int) -> list[GraftRow]:
    specs = [_random_spec(rng, components) for _ in range(6)]  # shared: layouts get reused
    prompts = []
    for _ in range(4):
        length = rng.randint(5, 9)
        prompts.append(([rng.randrange(3, 90) for _ in range(length)], length))
    rows = []
    for _ in range(n_rows):
        ids, length = rng.choice(prompts)
        spans = {"FE": [1, 2], "M": [length - 3, length - 2]}
        rows.append(GraftRow(ids, spans, rng.choice(specs)))
    return rows


def _same_patches(new: list[SitePatch], old: list[SitePatch]) -> None:
    assert [(p.path, p.donor, p.fused, p.n_heads, p.seq_dim) for p in new] == [
        (p.path, p.donor, p.fused, p.n_heads, p.seq_dim) for p in old
    ]
    for a, b in zip(new, old, strict=True):
        assert a.rows.dtype == torch.bool and torch.equal(a.rows, b.rows), a.path
        assert [k for k, _ in a.slices] == [k for k, _ in b.slices], a.path
        assert all(torch.equal(m, n) for (_, m), (_, n) in zip(a.slices, b.slices, strict=True))


@pytest.mark.parametrize("padding_side", ["left", "right"])
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_plans_equal_the_per_cell_marking(family, padding_side):
    arch = architecture_of(tiny_model(family))
    rng = random.Random(f"{family}-{padding_side}")
    layouts = plan_module.LayoutCache(max_cells=2000)  # kept across batches; evicts too
    for batch in range(4):
        rows = _random_rows(rng, arch.components, 24)
        resolved = [plan_module._resolve(arch, r) for r in rows]
        given = resolved if batch % 2 else None
        plan = plan_batch(arch, rows, padding_side=padding_side, resolved=given, layouts=layouts)
        padded = plan_module._pad(rows, 0, padding_side)
        assert plan.patches, "the random specs graft something"
        _same_patches(plan.patches, _reference_patches(arch, resolved, padded))
        _equal_masks_are_one_tensor(plan.patches)


def _equal_masks_are_one_tensor(patches: list[SitePatch]) -> None:
    """The executor gathers a module input once per mask object: equal masks must be one."""
    masks = [p.rows for p in patches]
    for i, a in enumerate(masks):
        for b in masks[i + 1 :]:
            assert (a is b) == torch.equal(a, b)


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_padding_equals_the_row_by_row_writes(padding_side):
    rng = random.Random(padding_side)
    rows = [GraftRow([rng.randrange(3, 90) for _ in range(rng.randint(1, 9))]) for _ in range(17)]
    rows.append(GraftRow(torch.tensor([5, 6, 7])))  # ids given as a tensor
    padded = plan_module._pad(rows, 2, padding_side)
    width = max(len(r.input_ids) for r in rows)
    for i, row in enumerate(rows):
        n = len(row.input_ids)
        off = width - n if padding_side == "left" else 0
        ids = torch.full((width,), 2)
        ids[off : off + n] = torch.as_tensor(list(row.input_ids))
        assert torch.equal(padded.input_ids[i], ids)
        assert padded.attention_mask[i].tolist() == [int(off <= j < off + n) for j in range(width)]
        expected = [j - off if off <= j < off + n else 0 for j in range(width)]
        assert padded.position_ids[i].tolist() == expected
        assert padded.offsets[i] == off and int(padded.last_index[i]) == off + n - 1
    assert padded.input_ids.dtype == padded.attention_mask.dtype == torch.long


def test_layout_cache_drops_the_oldest_beyond_its_budget():
    cache = plan_module.LayoutCache(max_cells=5)
    layouts = []
    for key in "abc":
        layout = plan_module._Layout()
        layout.add(("path", "sft"), 0, [0, 1])  # two positions and their slice: 4 cells
        layouts.append(layout)
        cache.put(key, layout)
    assert cache.get("a") is None and cache.get("b") is None
    assert cache.get("c") is layouts[2]
