"""``graft-exp patching``: weight grafting vs activation and residual-stream patching of the
same cells, on the same prompts and donor."""

from __future__ import annotations

from pathlib import Path

import click

from experiments.common import (
    DRY_RUN,
    GraftCommand,
    make_config,
    run_or_plan,
    shared_options,
    standalone,
    variant_option,
)
from experiments.shared import FE_OPTION, LAYERS_OPTION, POSITIONS_OPTION
from graft.core.spec import SpecError, parse_spec
from graft.results.compare import format_comparison
from graft.results.folder import RunFolder
from graft.study.grafts import check_layer_rule
from graft.study.patching import METHODS, check_methods, executor_for, patching_grafts, write_report
from graft.study.runner import ModelSource, default_out


@click.command(
    cls=GraftCommand,
    short_help="Weight grafting vs activation and residual patching of E1/E3's cells.",
)
@POSITIONS_OPTION
@LAYERS_OPTION
@FE_OPTION
@click.option(
    "--methods",
    default=",".join(METHODS),
    show_default=True,
    help="weights (graft's engine), activation (each cell's module output from the donor's "
    "own run), residual (each grafted layer's output from the donor's own run).",
)
@variant_option()
@shared_options
def patching(positions, layers, fe, methods, variant, cfg_options, remote):
    """Run E1's position grafts and E3's LT component sets three ways on the same prompts
    and donor: weight grafting, activation patching and residual-stream patching (see
    docs/patching.md), each into <out>/<method>; then write, in <out>, the summary per cell
    and method, paired contrasts between methods (exact McNemar with Holm and Newcombe's
    interval on top-5 hits; paired bootstrap on the whole name's log-prob and on the
    target's rank) and figures (a panel per cell, a bar per method). Whole names are always
    scored. The donor is finetuned first if the workspace lacks it."""
    names = [m.strip() for m in methods.split(",") if m.strip()]
    try:
        names = check_methods(names)
        if fe:
            parse_spec(f"FE:all:{fe}")
    except SpecError as err:
        raise click.BadParameter(str(err)) from None
    cfg = make_config("patching", dict(cfg_options, score_full_name=True), remote)
    try:
        check_layer_rule(layers, cfg.protocol)
        grafts = patching_grafts(positions, layers, cfg.head_policy, fe, cfg.protocol)
    except SpecError as err:
        raise click.BadParameter(str(err), param_hint="--layers") from None
    if cfg.remote_run:
        raise click.UsageError("patching runs on this machine only; drop the remote options")
    root = Path(cfg.out) if cfg.out else default_out(cfg)
    dry = click.get_current_context().meta.get(DRY_RUN)
    if not dry:
        RunFolder(root).check_owned()  # the combined results go into root itself
    for method in names:
        options = dict(cfg_options, out=str(root / method), score_full_name=True)
        method_cfg = make_config("patching", options, remote)
        extra = {} if dry else {"executor": executor_for(method)}
        click.echo(f"method: {method}")
        run_or_plan(
            method_cfg,
            grafts,
            donors={"sft": ModelSource(variant)},
            echo=click.echo,
            extra_config={"patching_method": method},
            **extra,
        )
    if dry:
        return
    report = write_report(root, names, cfg.model, n_boot=max(cfg.n_boot, 1), seed=cfg.seed)
    if not report.contrasts.is_empty():
        click.echo(format_comparison(report.contrasts))
    for png in report.figures:
        click.echo(f"figure: {png}")
    click.echo(f"results: {root}")


if __name__ == "__main__":
    standalone(patching)
