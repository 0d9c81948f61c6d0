"""``graft-exp attribution``: every cell's graft effect estimated from one backward pass
(``graft.attribute``), its table and layer map, and the top cells grafted for real."""

from __future__ import annotations

import click

from graft_experiments import common


class _VerifyCount(click.ParamType):
    """``--verify``: a number of cells per prompt (0: none), or ``all``."""

    name = "K|all"

    def convert(self, value, param, ctx):
        if isinstance(value, int) or value is None:
            return value
        if str(value).strip().lower() == "all":
            return None
        try:
            count = int(value)
        except ValueError:
            count = -1
        if count < 0:
            self.fail(f"{value!r}: give a number of cells (0 or more) or 'all'", param, ctx)
        return count


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
@click.option("--text", "texts", multiple=True, help="A prompt (repeat for more).")
@click.option(
    "--target",
    "targets",
    multiple=True,
    help="The target after each prompt, e.g. ' Tracey Childs' (its first token is scored): "
    "one per --text, or one for all.",
)
@click.option(
    "--dataset",
    type=click.Path(file_okay=False),
    help="Instead of --text/--target/--entity: a dataset folder (graft-exp data, "
    "WS/datasets/NAME), whose stored test prompts of --template (forward direction) are taken "
    "with their targets and first entities.",
)
@click.option(
    "--template",
    default="headline",
    show_default=True,
    help="With --dataset: the test template whose prompts are taken, or several "
    "comma-separated (headline,qa,movie).",
)
@click.option(
    "--n-prompts",
    "n_prompts",
    type=click.IntRange(min=1),
    default=None,
    help="With --dataset: the first N prompts of each template, in file order (default: all).",
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
    "--estimator",
    type=click.Choice(["local", "linear"]),
    default="local",
    show_default=True,
    help="local: the attention block's change computed exactly for q, k, v, o, qkv and attn "
    "cells, linear downstream; linear: first order in each module's output change, groups "
    "summing their leaves (docs/reference/attribution.md).",
)
@click.option(
    "--verify",
    type=_VerifyCount(),
    default=0,
    show_default=True,
    help="Graft the top K cells of each prompt for real ('all': every cell), print estimate "
    "and real effect, and add Pearson, sign agreement and top-5 overlap per unit and kind to "
    "summary.csv.",
)
@click.option(
    "--multi-cell",
    is_flag=True,
    help="Also graft multi-cell sets for real against the sum of their cells' estimates: each "
    "whole layer (ALL:l:attn,mlp), and FE, LT, FE+LT in every layer (multicell.csv).",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    required=True,
    help="Folder for estimates.csv, summary.csv, verify.csv, multicell.csv, config.json and "
    "figures/ (a run folder: graft-exp publish copies it into results/).",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace the results of another configuration in --out.",
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
    from graft.study import AttributionRequest, attribution_lines, run_attribution

    done = run_attribution(AttributionRequest(**request), out, overwrite=overwrite)
    for line in attribution_lines(done):
        click.echo(line)


if __name__ == "__main__":
    common.standalone(attribution)
