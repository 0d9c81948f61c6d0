"""Max |one-pass - token-by-token reference| per family and graft kind (float32).

Run from the repository root: python -m benchmarks.reference_table
Uses the same tiny models, prompts and specs as tests/core/test_engine.py.
"""

from __future__ import annotations

import torch

from graft.core import (
    EMBEDDING_COMPONENTS,
    TINY_FAMILIES,
    architecture_of,
    perturbed_copy,
    run_grafts,
    tiny_model,
)
from tests.core.test_engine import (
    COMPONENT_SPECS,
    HEAD_SPECS,
    LAYER_SPECS,
    MULTI_DONOR_SPECS,
    POSITION_SPECS,
    make_rows,
    reference,
)


def kind_of(text: str) -> str:
    if text in POSITION_SPECS:
        return "positions"
    if text in COMPONENT_SPECS:
        return "component groups"
    if text in LAYER_SPECS:
        return "layer subsets"
    if text in HEAD_SPECS:
        return "head policies"
    if text in MULTI_DONOR_SPECS:
        return "two donors"
    if text == "none":
        return "nothing"
    comp = text.split(":")[2]
    return "embeddings" if comp in EMBEDDING_COMPONENTS else "single components"


def main() -> None:
    kinds = [
        "nothing",
        "positions",
        "single components",
        "component groups",
        "layer subsets",
        "embeddings",
        "head policies",
        "two donors",
    ]
    print("| family | " + " | ".join(kinds) + " | rows |")
    print("|---|" + "---:|" * (len(kinds) + 1))
    for family in TINY_FAMILIES:
        base = tiny_model(family, seed=0)
        donors = {"sft": perturbed_copy(base, seed=1), "task": perturbed_copy(base, seed=2)}
        arch = architecture_of(base)
        rows = make_rows(arch)
        refs = torch.stack([reference(base, donors, arch, r) for r in rows])
        worst: dict[str, float] = {}
        for padding in ("left", "right"):
            out = run_grafts(base, donors, rows, batch_size=7, padding_side=padding)
            for row, diff in zip(rows, (out - refs).abs().amax(-1), strict=True):
                k = kind_of(str(row.spec))
                worst[k] = max(worst.get(k, 0.0), float(diff))
        cells = " | ".join(f"{worst[k]:.1e}" if k in worst else "-" for k in kinds)
        print(f"| {family} | {cells} | {2 * len(rows)} |")


if __name__ == "__main__":
    main()
