"""``graft-exp attribution``: every cell's graft effect estimated from one backward pass
(``graft.attribute``), its table and layer map, and the top cells grafted for real."""

from __future__ import annotations

import click

from graft.study import AttributionRequest
from graft_experiments import common
from graft_experiments.options import ATTRIBUTION_FLAGS

_PROMPTS = ("texts", "targets", "entity", "dataset", "template", "n_prompts")


@click.command(
    cls=common.GraftCommand,
    sections={
        "base": common.MODEL_DATA,
        "donor": common.MODEL_DATA,
        **dict.fromkeys(_PROMPTS, "Prompts"),
    },
)
@common.with_options(
    [
        *(common.field_option(AttributionRequest, name) for name in ATTRIBUTION_FLAGS),
        click.option(
            "--out",
            type=click.Path(file_okay=False),
            required=True,
            help="Folder for estimates.csv, summary.csv, verify.csv, multicell.csv, "
            "config.json and figures/ (a run folder: graft-exp publish copies it into results/).",
        ),
        click.option(
            "--overwrite",
            is_flag=True,
            help="Replace the results of another configuration in --out.",
        ),
    ]
)
def attribution(out, overwrite, **request):
    """Estimate the effect of grafting every single cell (layer x position unit x module
    kind) on the target's first-token log-prob from one forward and one backward of the
    ungrafted base: grad(module output) . (donor module(x) - base module(x)) summed over the
    unit's positions; for attention cells (--estimator local, the default) the attention
    block's exact change instead, times grad(block output), over every position
    (docs/reference/attribution.md). Units: LT and, with --entity, FE.

    Writes estimates.csv (prompt, layer, unit, kind, estimate), summary.csv (per unit and
    kind: mean estimate, top layer; with --verify Pearson, sign agreement and top-5 overlap
    against the real grafts), figures/attribution_map.png (the estimate averaged over prompts,
    unit:kind x layer) and config.json (the command, commit, machine and the donor's own
    record: graft-exp publish takes the folder); with --verify K also verify.csv (the top K
    cells per prompt grafted for real), with --multi-cell multicell.csv and
    multicell_summary.csv, each printed. With --dataset the prompts, targets and first
    entities are a dataset's test prompts (--template, --n-prompts) instead of --text, --target and
    --entity."""
    from graft.study import attribution_lines, run_attribution

    done = run_attribution(AttributionRequest(**request), out, overwrite=overwrite)
    for line in attribution_lines(done):
        click.echo(line)


if __name__ == "__main__":
    common.standalone(attribution)
