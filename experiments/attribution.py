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
    help="With --dataset: the test template whose prompts are taken.",
)
@click.option(
    "--n-prompts",
    "n_prompts",
    type=click.IntRange(min=1),
    default=None,
    help="With --dataset: the first N prompts of the template, in file order (default: all).",
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
def attribution(
    base,
    donor,
    texts,
    targets,
    dataset,
    template,
    n_prompts,
    entity,
    kinds,
    metric,
    estimator,
    verify,
    multi_cell,
    out,
    overwrite,
):
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
    if dataset is not None:
        if texts or targets or entity:
            raise click.UsageError(
                "--dataset takes the prompts from the dataset: drop --text, --target and --entity"
            )
        from graft.errors import GraftError
        from graft.study import entity_prompts

        try:
            found = entity_prompts(dataset, template, n_prompts)
        except GraftError as error:
            raise click.UsageError(str(error)) from None
        texts, targets, entity = (tuple(column) for column in zip(*found, strict=True))
    elif n_prompts is not None or template != "headline":
        raise click.UsageError(
            "--template and --n-prompts choose a --dataset's prompts: add --dataset"
        )
    if not texts or not targets:
        raise click.UsageError("give the prompts: --text and --target (repeat), or --dataset")
    if len(targets) not in (1, len(texts)):
        raise click.UsageError(f"--target: one per --text ({len(texts)}), or one for all")
    if entity and len(entity) != len(texts):
        raise click.UsageError(f"--entity: one per --text ({len(texts)})")
    for text, name in zip(texts, entity, strict=False):
        if name not in text:
            raise click.UsageError(f"--entity {name!r} does not occur in --text {text!r}")
    import time

    import graft
    from graft.core import DEFAULT_KINDS, verify_attribution, verify_multicell
    from graft.errors import GraftError
    from graft.results import (
        RunFolder,
        attribution_map,
        cell_summary,
        multicell_summary,
        save_figure,
    )
    from graft.study import finetune_record, model_fingerprint

    fields = [{"FE": name} for name in entity] if entity else None
    target_list = list(targets) if len(targets) > 1 else targets[0]
    kind_list = list(kinds) or list(DEFAULT_KINDS)
    args = dict(fields=fields, metric=metric)
    folder = RunFolder(out)
    key = ["experiment", "options", "base", "donors"]
    timings: dict[str, float] = {}
    try:
        base_model, donor_model = graft.load_model(base), graft.load_model(donor)
        config = {
            "experiment": "attribution",
            "options": {
                "model": base,
                "donor": donor,
                "dataset": dataset,
                "template": template if dataset is not None else None,
                "n": n_prompts,
                "texts": list(texts),
                "targets": list(targets),
                "entity": list(entity),
                "kinds": kind_list,
                "metric": metric,
                "estimator": estimator,
                "verify": "all" if verify is None else verify,
                "multi_cell": multi_cell,
                "dtype": str(base_model.dtype).removeprefix("torch."),
            },
            "base": _model_entry(base_model, model_fingerprint),
            "donors": {"sft": _model_entry(donor_model, model_fingerprint)},
            "finetuned_models": {
                m.location: r
                for m in (base_model, donor_model)
                if (r := finetune_record(m.location)) is not None
            },
        }
        folder.check_writable()
        if not overwrite:
            folder.check_config(config, key)
        start = time.perf_counter()
        table = graft.attribute(
            base_model,
            donor_model,
            None,
            list(texts),
            target_list,
            kinds=kind_list,
            estimator=estimator,
            **args,
        )
        timings["attribution_seconds"] = time.perf_counter() - start
        checked = multi = None
        if verify != 0:
            start = time.perf_counter()
            checked = verify_attribution(
                base_model, donor_model, None, list(texts), target_list, table, top_k=verify, **args
            )
            timings["verify_seconds"] = time.perf_counter() - start
        if multi_cell:
            start = time.perf_counter()
            multi = verify_multicell(
                base_model, donor_model, None, list(texts), target_list, estimator=estimator, **args
            )
            timings["multicell_seconds"] = time.perf_counter() - start
        summary = cell_summary(table, checked)
        config.update({"cells": len(table), **{k: round(v, 3) for k, v in timings.items()}})
        folder.write_config(config, key, overwrite=overwrite)
    except GraftError as error:
        raise click.UsageError(str(error)) from None
    table.write_csv(folder.path / "estimates.csv")
    summary.write_csv(folder.path / "summary.csv")
    figure = attribution_map(table, metric)
    save_figure(figure, folder.path / "figures", "attribution_map")
    seconds = timings["attribution_seconds"]
    click.echo(f"attribution: {len(table)} cells in {seconds:.1f} s -> {out}/estimates.csv")
    if checked is not None:
        checked.write_csv(folder.path / "verify.csv")
        verify_seconds = timings["verify_seconds"]
        click.echo(f"verify: {len(checked)} real grafts in {verify_seconds:.1f} s")
        for row in checked.head(_PRINTED).iter_rows(named=True):
            click.echo(
                f"  prompt {row['prompt']} {row['unit']}:{row['layer']}:{row['kind']}  "
                f"estimate {row['estimate']:+.4f}  real {row['real']:+.4f}"
            )
        if len(checked) > _PRINTED:
            click.echo(f"  ... {len(checked) - _PRINTED} more in {out}/verify.csv")
        click.echo("agreement with the real grafts, per unit and kind:")
        for row in summary.iter_rows(named=True):
            click.echo("  " + _agreement_line(row))
    if multi is not None:
        multi.write_csv(folder.path / "multicell.csv")
        sets = multicell_summary(multi)
        sets.write_csv(folder.path / "multicell_summary.csv")
        click.echo(
            f"multi-cell: {len(multi)} real grafts in {timings['multicell_seconds']:.1f} s "
            "(estimate: the sum of the cells' estimates)"
        )
        for row in sets.iter_rows(named=True):
            click.echo(
                f"  {row['set']:6} n={row['grafts']:<3} estimate {row['mean_estimate']:+.3f}  "
                f"real {row['mean_real']:+.3f}  mean |error| {row['mean_abs_error']:.3f}  "
                f"median relative error {_number(row['median_relative_error'])}"
            )
    folder.commit_config()


#: the verified cells printed (all are in verify.csv)
_PRINTED = 20


def _model_entry(model, fingerprint) -> dict:
    """What a run records of a loaded model: its description and folder's fingerprint."""
    return {"path": model.location, "fingerprint": fingerprint(model.location), **model.describe()}


def _number(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def _agreement_line(row: dict) -> str:
    overlap = row.get("top_k_overlap")
    return (
        f"{row['unit']:4} {row['kind']:5} cells {row['verified']:<4} Pearson "
        f"{_number(row['pearson'])}  sign {_number(row['sign_agreement'])} "
        f"(of {row['moving']})  top-{row['top_k']} overlap {_number(overlap)}"
        + ("" if row["meets_bar"] is None else ("  >= 0.95" if row["meets_bar"] else "  < 0.95"))
    )


if __name__ == "__main__":
    common.standalone(attribution)
