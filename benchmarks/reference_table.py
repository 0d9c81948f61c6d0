"""Max |one-pass - token-by-token reference| per family and graft kind (float32).

Run from the repository root: python -m benchmarks.reference_table [--out results/FOLDER]
Uses the same tiny models, prompts and specs as tests/core/execution/test_engine.py. It prints the
markdown table; ``--out`` also writes it as ``reference_table.csv`` with its provenance
(command, commit, machine), the folder docs/explanation/exactness.md shows.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch

from benchmarks.measure import write_table
from graft.core import EMBEDDING_COMPONENTS, architecture_of, run_grafts
from graft.models import TINY_FAMILIES, perturbed_copy, tiny_model
from tests.core.execution.test_engine import (
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


KINDS = (
    "nothing",
    "positions",
    "single components",
    "component groups",
    "layer subsets",
    "embeddings",
    "head policies",
    "two donors",
)


def measure(family: str) -> dict[str, float | int | str]:
    """One family's row: the worst difference per graft kind over left and right padding,
    and the rows compared."""
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
    return {"family": family, **{k: worst[k] for k in KINDS if k in worst}, "rows": 2 * len(rows)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.reference_table")
    parser.add_argument("--out", help="results folder to write reference_table.csv into")
    args = parser.parse_args(argv)
    print("| family | " + " | ".join(KINDS) + " | rows |")
    print("|---|" + "---:|" * (len(KINDS) + 1))
    table = []
    for family in TINY_FAMILIES:
        row = measure(family)
        table.append(row)
        cells = " | ".join(f"{row[k]:.1e}" if k in row else "-" for k in KINDS)
        print(f"| {family} | {cells} | {row['rows']} |")
    if args.out:
        settings = {"dtype": "float32", "paddings": ["left", "right"], "batch_size": 7}
        path = write_table(args.out, "reference_table", table, argv, "cpu", settings)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
