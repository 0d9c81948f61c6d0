"""``graft-exp smoke``: a seconds-long self-check of the install on tiny random models."""

from __future__ import annotations

from typing import Any

import click
import torch

from graft.core import TINY_FAMILIES, GraftRow, engine_path, parse_spec, run_grafts, tiny_pair
from graft_experiments.common import GraftCommand, standalone

SMOKE_SPECS = [
    "none",
    "ALL:all:all; head=donor",
    "FE:all:all",
    "LT:all:all",
    "FE+LT:all:all",
    "(FE+LT)^C:all:all",
    "LT:q4:o,ffn",
]
#: spec -> the model whose plain forward pass it must reproduce.
INVARIANTS = {"none": "base", "ALL:all:all; head=donor": "donor"}
#: The engine's float32 bound against an independent computation.
TOLERANCE = 1e-5


def check_family(
    family: str, seed: int = 0
) -> tuple[list[tuple[str, float]], list[str], dict[str, Any]]:
    """Graft a tiny random ``family`` pair in one pass.

    Returns:
        (spec, max |logit - base logit|) per spec; the failed invariants (empty when
        grafting nothing gives the base's own logits and grafting everything with the donor's
        head gives the donor's, within :data:`TOLERANCE`); and the engine path on the pair
        (:func:`graft.core.engine.engine_path`).
    """
    base, donor = tiny_pair(family, seed=seed)
    g = torch.Generator().manual_seed(seed)
    prompts = [[1] + torch.randint(3, 96, (n,), generator=g).tolist() for n in (6, 9, 12)]
    rows = [GraftRow(p, {"FE": [1, 2]}, parse_spec(s)) for s in SMOKE_SPECS for p in prompts]
    logits = run_grafts(base, {"sft": donor}, rows).reshape(len(SMOKE_SPECS), len(prompts), -1)
    with torch.no_grad():
        plain = {
            name: torch.stack([model(torch.tensor([p])).logits[0, -1].float() for p in prompts])
            for name, model in (("base", base), ("donor", donor))
        }
    shifts = [
        (s, float((logits[i] - plain["base"]).abs().max())) for i, s in enumerate(SMOKE_SPECS)
    ]
    failed = []
    for spec, model in INVARIANTS.items():
        diff = float((logits[SMOKE_SPECS.index(spec)] - plain[model]).abs().max())
        if diff > TOLERANCE:
            failed.append(f"{family}: {spec!r} differs from the {model} by {diff:.2e}")
    return shifts, failed, engine_path(base, {"sft": donor})


def path_word(path: dict) -> str:
    """One word for an :func:`graft.core.engine.engine_path`: ``prefix`` (every shortcut,
    the shared prefix through its cache argument) or ``whole`` (rows run whole: slower)."""
    return "prefix" if path["shared_prefix"] else "whole"


@click.command(cls=GraftCommand)
@click.option(
    "--family",
    type=click.Choice(["all", *TINY_FAMILIES]),
    default="all",
    show_default=True,
    help="Model family to check.",
)
def smoke(family: str) -> None:
    """Check this install on tiny random models of each FAMILY (seconds, no download).

    Grafting nothing must give the base model's own logits and grafting everything with the
    donor's head the donor's (within 1e-5); exit 1 otherwise. Also prints how far each graft
    moves the final logits away from the base, and the engine's path per family (``prefix``:
    every shortcut; ``whole``: the installed transformers offers no key/value cache argument
    graft knows, so rows run whole, slower, with a line saying why).
    """
    families = TINY_FAMILIES if family == "all" else (family,)
    failures, columns, paths = [], [], {}
    for name in families:
        shifts, failed, paths[name] = check_family(name)
        failures += failed
        columns.append([shift for _, shift in shifts])
    click.echo("max |logit - base logit| per graft and family (tiny random models):")
    click.echo(f"{'graft':<24}" + "".join(f"{name:>10}" for name in families))
    for i, spec in enumerate(SMOKE_SPECS):
        click.echo(f"{spec:<24}" + "".join(f"{col[i]:>10.4f}" for col in columns))
    click.echo(f"{'engine path':<24}" + "".join(f"{path_word(p):>10}" for p in paths.values()))
    for reason in dict.fromkeys(r for p in paths.values() for r in p["fallbacks"]):
        click.echo(f"slow path: {reason}")
    if failures:
        raise click.ClickException("; ".join(failures))
    click.echo(
        f"ok: grafting nothing gives the base's logits and grafting everything with the "
        f"donor's head the donor's, within {TOLERANCE:g}, in {len(families)} "
        f"famil{'y' if len(families) == 1 else 'ies'}"
    )


if __name__ == "__main__":
    standalone(smoke)
