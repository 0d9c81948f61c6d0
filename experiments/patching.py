"""``graft-exp patching``: weight grafting beside activation patching as the field runs it,
layer by layer (or in windows), per position unit and kind of site, in both directions."""

from __future__ import annotations

from pathlib import Path

import click

from graft.core import architecture_of, parse_spec
from graft.errors import GraftError, SpecError
from graft.models import context_length, load_model
from graft.results import RunFolder
from graft.study import (
    PATCH_MODES,
    SITE_KINDS,
    UNITS,
    WHOLE_DEPTH,
    ModelSource,
    check_choices,
    default_out,
    direction_models,
    executor_for,
    load_examples,
    resolve_model_path,
    sample_examples,
    sweep_grafts,
    with_protocol,
    write_sweep_report,
)
from graft_experiments.common import (
    DRY_RUN,
    GraftCommand,
    cli_error,
    make_config,
    run_or_plan,
    shared_options,
    standalone,
    variant_option,
)

#: What ``--methods`` accepts: the engine's graft, or patching the donor's own values.
METHODS = ("weights", "patching")


def _items(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def run_methods(methods: list[str], kinds: list[str], whole: list[str]) -> list[str]:
    """The runs of one direction: ``weights`` (every kind), ``activation`` (attention and
    MLP outputs, and the whole-depth cells) and ``residual`` (layer outputs)."""
    runs = ["weights"] if "weights" in methods else []
    if "patching" in methods:
        if {"attn", "mlp"} & set(kinds) or whole:
            runs.append("activation")
        if "residual" in kinds:
            runs.append("residual")
    return runs


@click.command(
    cls=GraftCommand,
    short_help="Weight grafting vs activation patching, layer by layer (causal-tracing maps).",
)
@click.option(
    "--positions",
    default=",".join(UNITS),
    show_default=True,
    help="Position units (rows of the maps), comma-separated position expressions; "
    "FE[:-1] is the first entity but its last token, FE[-1] its last token.",
)
@click.option(
    "--kinds",
    default=",".join(SITE_KINDS),
    show_default=True,
    help="Sites: residual (a layer's output), attn (the attention block's output), mlp "
    "(the MLP block's output).",
)
@click.option(
    "--modes",
    default=",".join(PATCH_MODES),
    show_default=True,
    help="restore (PRE runs, SFT's values go in: denoising) and/or break (SFT runs, PRE's "
    "go in: noising).",
)
@click.option(
    "--window",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Layers per cell: 1 patches each layer alone; K patches the K layers centred on it.",
)
@click.option(
    "--methods",
    default=",".join(METHODS),
    show_default=True,
    help="weights (the donor's weights of the site's modules compute on the run's own "
    "activations) and/or patching (the donor's own-run output of the site is written in).",
)
@click.option(
    "--whole-depth",
    default=",".join(WHOLE_DEPTH),
    show_default=True,
    help="E1's position sets also run in every layer at once by both methods ('' for none); "
    "cells identical by construction and patches that copy the donor's whole stream are "
    "labelled, not tested.",
)
@variant_option()
@shared_options
def patching(positions, kinds, modes, window, methods, whole_depth, variant, cfg_options, remote):
    """Sweep the layers: at each position unit, each layer (or window) and each kind of site,
    give the running model the other model's values, by grafting weights and by patching
    activations, in both directions; then write in <out> the effect of every cell (0 = the
    running model, 1 = the other one, in mean target log-prob, with a paired bootstrap
    interval), weights against patching cell by cell (exact McNemar and paired bootstrap,
    Holm over the cells that test something), per-cell findings, and layer x position maps
    like causal-tracing figures (see docs/patching.md). The donor is finetuned first if the
    workspace lacks it."""
    try:
        units = _items(positions)
        for unit in units:
            parse_spec(f"{unit}:all:all")
        kind_list = check_choices(_items(kinds), SITE_KINDS, "kinds")
        direction_list = check_choices(_items(modes), PATCH_MODES, "modes")
        method_list = check_choices(_items(methods), METHODS, "methods")
        whole = _items(whole_depth)
        for pos in whole:
            parse_spec(f"{pos}:all:all")
    except SpecError as err:
        raise click.BadParameter(str(err)) from None
    if not units:
        raise click.BadParameter(
            "name at least one position unit, e.g. LT", param_hint="--positions"
        )
    setup = make_config("patching", cfg_options, remote)
    if setup.execution.remote_run:
        raise click.UsageError("patching runs on this machine only; drop the remote options")
    try:
        loaded = load_model(
            resolve_model_path(setup, ModelSource()), dtype=setup.execution.dtype, device="cpu"
        )
        arch = architecture_of(loaded.model)
        if window > arch.n_layers:
            raise click.BadParameter(
                f"{window} is more than the model's {arch.n_layers} layers", param_hint="--window"
            )
    except GraftError as err:
        raise cli_error(err) from None
    root = Path(setup.execution.out) if setup.execution.out else default_out(setup)
    dry = click.get_current_context().meta.get(DRY_RUN)
    if not dry:
        RunFolder(root).check_owned()  # the combined results go into root itself
    grafts, references = {}, {}
    for name in direction_list:
        direction = direction_models(name, variant)
        references[name] = (direction.base_label, direction.donor_label)
        for run in run_methods(method_list, kind_list, whole):
            run_grafts = with_protocol(
                sweep_grafts(
                    arch,
                    run,
                    direction,
                    units,
                    window,
                    kind_list,
                    setup.analysis.head_policy,
                    whole,
                ),
                setup.protocol,
            )
            grafts[(name, run)] = run_grafts
            run_cfg = make_config(
                "patching", dict(cfg_options, out=str(root / f"{name}-{run}")), remote
            )
            click.echo(f"{name}, {run}: {len(run_grafts)} grafts")
            run_or_plan(
                run_cfg,
                run_grafts,
                base=direction.base,
                donors=direction.donors,
                echo=click.echo,
                extra_config={"patching_method": run, "direction": name},
                **({} if dry else {"executor": executor_for(run)}),
            )
    if dry:
        return
    first = RunFolder(root / "-".join(next(iter(grafts)))).read_config() or {}
    try:
        found, _ = load_examples(
            Path(first["dataset"]["path"]),
            loaded.tokenizer,
            setup.data,
            context_length(loaded.model),
        )
    except GraftError as err:
        raise cli_error(err) from None
    prompts = sample_examples(found, setup.data.n, setup.data.sample_seed)
    config = {
        "experiment": "patching",
        "model": setup.donors.model,
        "variant": variant,
        "units": units,
        "kinds": kind_list,
        "directions": direction_list,
        "window": window,
        "methods": method_list,
        "whole_depth": whole,
        "runs": [f"{d}-{r}" for d, r in grafts],
        "n": setup.data.n,
        "seed": setup.analysis.seed,
        "protocol": setup.protocol.name,
        "head_policy": setup.analysis.head_policy,
    }
    report = write_sweep_report(
        root,
        grafts,
        references,
        arch,
        prompts,
        config,
        units=units,
        model=setup.donors.model,
        n_boot=max(setup.analysis.n_boot, 1),
        seed=setup.analysis.seed,
    )
    for line in summary_lines(report.findings):
        click.echo(line)
    for png in report.figures:
        click.echo(f"figure: {png}")
    click.echo(f"results: {root}")


def summary_lines(findings) -> list[str]:
    """One line per (direction, kind, unit, method) of the findings table."""
    lines = []
    for r in findings.iter_rows(named=True):
        half = "never" if r["first_layer_half"] is None else f"layer {r['first_layer_half']}"
        differ = ""
        if r.get("layers_tested"):
            differ = f"; methods differ at {r['layers_differ']} of {r['layers_tested']} layers"
        lines.append(
            f"{r['direction']} {r['kind']} {r['unit']} [{r['method']}]: peak effect "
            f"{r['peak_effect']:.2f} at layer {r['peak_layer']}, half reached {half}{differ}"
        )
    return lines


if __name__ == "__main__":
    standalone(patching)
