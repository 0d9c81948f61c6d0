"""``graft-exp smoke``: graft a tiny random model pair and check it against the weight-swap rule."""

from __future__ import annotations

import click
import torch

from graft.engine import GraftRow, run_grafts
from graft.spec import parse_spec
from graft.tiny import TINY_FAMILIES, tiny_pair

SMOKE_SPECS = [
    "none",
    "FE:all:all",
    "LT:all:all",
    "FE+LT:all:all",
    "(FE+LT)^C:all:all",
    "LT:q4:o,ffn",
]


@click.command()
@click.option("--family", type=click.Choice(TINY_FAMILIES), default="llama", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def smoke(family: str, seed: int) -> None:
    """Graft a tiny random FAMILY pair in one pass and print how far each graft moves the logits."""
    base, donor = tiny_pair(family, seed=seed)
    g = torch.Generator().manual_seed(seed)
    prompts = [[1] + torch.randint(3, 96, (n,), generator=g).tolist() for n in (6, 9, 12)]
    rows = [GraftRow(p, {"FE": [1, 2]}, parse_spec(s)) for s in SMOKE_SPECS for p in prompts]
    logits = run_grafts(base, {"sft": donor}, rows)
    base_logits = logits[: len(prompts)]
    click.echo(f"{'graft':<22} max |logit - base|")
    for i, spec in enumerate(SMOKE_SPECS):
        shift = (logits[i * len(prompts) : (i + 1) * len(prompts)] - base_logits).abs().max()
        click.echo(f"{spec:<22} {float(shift):.4f}")
