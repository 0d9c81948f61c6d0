"""``graft-exp custom``: any graft specs, any donors, on a dataset's test prompts."""

from __future__ import annotations

import click

from graft.errors import GraftError, SpecError
from graft.models import ModelNotFoundError, resolve_model_name
from graft.study import ModelSource, Protocol, parse_variant, protocol_notes, reference, spec_graft
from graft_experiments.common import VARIANTS as COMMON_VARIANTS
from graft_experiments.common import (
    GraftCommand,
    echo_figures,
    echo_protocol_notes,
    make_config,
    protocol_default,
    run_or_plan,
    shared_options,
    standalone,
)

#: What NAME=VARIANT accepts (see ``graft.study.training.workspace.parse_variant``).
VARIANTS = ("pretrained", *COMMON_VARIANTS)


def _sources(values, param_hint: str = "--donor") -> dict[str, ModelSource]:
    out = {}
    for value in values:
        name, sep, source = value.partition("=")
        if not sep or not name.strip() or not source.strip():
            raise click.BadParameter(
                f"{value!r}: use NAME=VARIANT or NAME=PATH", param_hint=param_hint
            )
        source = source.strip()
        if name.strip() in out:
            raise click.BadParameter(f"{name.strip()!r} is given twice", param_hint=param_hint)
        if source not in VARIANTS:
            try:
                resolve_model_name(source)
            except ModelNotFoundError:
                raise click.BadParameter(
                    f"{source!r} is neither a variant ({', '.join(VARIANTS)}) nor a model "
                    "folder, registry name or hub id",
                    param_hint=param_hint,
                ) from None
            except GraftError as err:  # e.g. a folder that holds no model
                raise click.BadParameter(str(err), param_hint=param_hint) from None
        out[name.strip()] = ModelSource(source) if source in VARIANTS else ModelSource(path=source)
    return out


def _protocol_run_options(protocol: Protocol, sources: list[ModelSource]) -> dict:
    """``protocol``'s run options: under the paper's, test prompts from the both-direction
    dataset when a variant model is trained on both directions (no extra dataset generated),
    and a run folder of its own (``-paper``)."""
    options: dict = {"out_tag": protocol.run_tag} if protocol.run_tag else {}
    if protocol.test_prompts_from_donor:
        variants = [s.variant for s in sources if not s.path and s.variant != "pretrained"]
        both = any(parse_variant(v)[0] == "both" for v in variants)
        options["data_direction"] = "both" if both else "one"
    return options


@click.command(
    cls=GraftCommand, short_help="Any graft specs and donors on a dataset's test prompts."
)
@click.option(
    "--spec",
    "specs",
    multiple=True,
    required=True,
    help="Graft as NAME=SPEC or SPEC (repeatable), e.g. 'LT:q4:o,ffn' or 'mine=FE:all:attn@task; "
    "LT:h2:mlp'. A spec without head= gets --head-policy, one without protocol= is resolved "
    "under --protocol.",
)
@click.option(
    "--donor",
    "donor_args",
    multiple=True,
    default=("sft=one",),
    help="Donor as NAME=VARIANT (finetuned as needed: one, both, task, relation, pretrained) "
    "or NAME=PATH (repeatable). [default: sft=one; sft=both under --protocol paper]",
)
@click.option(
    "--base",
    "base_arg",
    default="pretrained",
    show_default=True,
    help="Base: a variant (pretrained, one, both, ...) or a model folder.",
)
@click.option(
    "--directions",
    default="forward",
    show_default=True,
    type=click.Choice(["forward", "reverse", "forward,reverse"]),
    help="Test prompt directions.",
)
@click.option(
    "--references/--no-references",
    default=True,
    show_default=True,
    help="Add PRE (base alone) and SFT (donor 'sft' with its head).",
)
@shared_options
def custom(specs, donor_args, base_arg, directions, references, cfg_options, remote):
    """Run any graft specs (see docs/specs.md) on the dataset's test prompts.

    Under --protocol paper: the paper's layer groups, head policy and 'all' without pos_embed
    in every spec that does not set its own, and sft=both as the default donor. The test
    prompts come from the both-direction dataset when a variant model is trained on both."""
    setup = make_config("custom", cfg_options, remote, directions=tuple(directions.split(",")))
    donor_args = protocol_default(
        "donor_args", donor_args, (f"sft={setup.protocol.donor_variant}",)
    )
    donors = _sources(donor_args)
    base = _sources([f"base={base_arg}"], param_hint="--base")["base"]
    try:
        grafts = [spec_graft(s, setup.analysis.head_policy, setup.protocol) for s in specs]
    except SpecError as err:
        raise click.BadParameter(str(err), param_hint="--spec") from None
    if references:
        refs = [reference("PRE", None)] + ([reference("SFT", "sft")] if "sft" in donors else [])
        grafts = refs + grafts
    notes = echo_protocol_notes(protocol_notes(grafts, setup.protocol))
    run = run_or_plan(
        setup,
        grafts,
        base=base,
        donors=donors,
        echo=click.echo,
        extra_config=notes,
        **_protocol_run_options(setup.protocol, [base, *donors.values()]),
    )
    if run is not None:  # None: --dry-run
        echo_figures(run.folder.path)


if __name__ == "__main__":
    standalone(custom)
