"""``graft-exp attribution``: every cell's graft effect estimated from one backward pass
(``graft.attribute``), its table and layer map, and the top cells grafted for real."""

from __future__ import annotations

import click

from graft_experiments import common


@click.command(cls=common.GraftCommand)
@click.option(
    "--base-model",
    "base",
    default="smollm2-135m",
    show_default=True,
    help="Base model: name or folder.",
)
@click.option(
    "--donor-model", "donor", required=True, help="Donor (finetuned) model: name or folder."
)
@click.option("--text", "texts", multiple=True, required=True, help="A prompt (repeat for more).")
@click.option(
    "--target",
    "targets",
    multiple=True,
    required=True,
    help="The target after each prompt, e.g. ' Tracey Childs' (its first token is scored): "
    "one per --text, or one for all.",
)
@click.option(
    "--entity",
    multiple=True,
    help="The first entity in each prompt (a substring), the FE unit: one per --text.",
)
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    help="Module kinds as specs name them (repeat); default q k v qkv o attn mlp.",
)
@click.option(
    "--measure",
    "metric",
    type=click.Choice(["logprob", "logit"]),
    default="logprob",
    show_default=True,
    help="What is estimated: the target's first-token log-prob, or its raw logit.",
)
@click.option(
    "--verify",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="Graft the top K cells of each prompt for real and print estimate and real effect.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    required=True,
    help="Folder for attribution.csv, verify.csv, config.json and figures/.",
)
def attribution(base, donor, texts, targets, entity, kinds, metric, verify, out):
    """Estimate the effect of grafting every single cell (layer x position unit x module
    kind) on the target's first-token log-prob from one forward and one backward of the
    ungrafted base: grad(module output) . (donor module(x) - base module(x)) summed over the
    unit's positions (docs/reference/attribution.md). Units: LT and, with --entity, FE.

    Writes attribution.csv (prompt, layer, unit, kind, estimate), figures/attribution_map.png
    (the estimate averaged over prompts, unit:kind x layer) and config.json; with --verify K
    also verify.csv (the top K cells per prompt grafted for real) and prints both."""
    if len(targets) not in (1, len(texts)):
        raise click.UsageError(f"--target: one per --text ({len(texts)}), or one for all")
    if entity and len(entity) != len(texts):
        raise click.UsageError(f"--entity: one per --text ({len(texts)})")
    for text, name in zip(texts, entity, strict=False):
        if name not in text:
            raise click.UsageError(f"--entity {name!r} does not occur in --text {text!r}")
    import json
    import time
    from pathlib import Path

    import graft
    from graft.core import DEFAULT_KINDS, verify_attribution
    from graft.errors import GraftError
    from graft.results import attribution_map, save_figure
    from graft.storage import atomic_path

    fields = [{"FE": name} for name in entity] if entity else None
    target_list = list(targets) if len(targets) > 1 else targets[0]
    args = dict(fields=fields, metric=metric)
    try:
        base_model, donor_model = graft.load_model(base), graft.load_model(donor)
        start = time.perf_counter()
        table = graft.attribute(
            base_model,
            donor_model,
            None,
            list(texts),
            target_list,
            kinds=list(kinds) or DEFAULT_KINDS,
            **args,
        )
        seconds = time.perf_counter() - start
        checked = None
        if verify:
            start = time.perf_counter()
            checked = verify_attribution(
                base_model, donor_model, None, list(texts), target_list, table, top_k=verify, **args
            )
            verify_seconds = time.perf_counter() - start
    except GraftError as error:
        raise click.UsageError(str(error)) from None
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    table.write_csv(folder / "attribution.csv")
    figure = attribution_map(table, metric)
    save_figure(figure, folder / "figures", "attribution_map")
    record = {
        "command": "attribution",
        "base": base,
        "donor": donor,
        "texts": list(texts),
        "targets": list(targets),
        "entity": list(entity),
        "kinds": list(kinds) or list(DEFAULT_KINDS),
        "metric": metric,
        "cells": len(table),
        "attribution_seconds": round(seconds, 3),
    }
    click.echo(f"attribution: {len(table)} cells in {seconds:.1f} s -> {folder}/attribution.csv")
    if checked is not None:
        checked.write_csv(folder / "verify.csv")
        record.update(verify=verify, verify_seconds=round(verify_seconds, 3))
        click.echo(f"verify: {len(checked)} real grafts in {verify_seconds:.1f} s")
        for row in checked.iter_rows(named=True):
            click.echo(
                f"  prompt {row['prompt']} {row['unit']}:{row['layer']}:{row['kind']}  "
                f"estimate {row['estimate']:+.4f}  real {row['real']:+.4f}"
            )
    with atomic_path(folder / "config.json") as tmp:
        tmp.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    common.standalone(attribution)
