"""``graft-exp finetune``: finetune a base model on a fact dataset (the SFT donor).

It takes the experiments' vocabulary (``--dataset``, ``--variant``, ``--n-facts``,
``--data-seed``, ``--shuffle``, ``--preset``, ``--finetune-max-steps``, ``--workspace``,
``--device``), so ``graft-exp finetune --variant task`` trains exactly the donor
``graft-exp hybrid`` would.
"""

from __future__ import annotations

from pathlib import Path

import click

from graft import study
from graft.study import ExperimentConfig, FinetuneConfig
from graft_experiments import common
from graft_experiments.options import FINETUNE_FLAGS, cli_only_option

_FINETUNING = "Finetuning"
#: FinetuneConfig's fields with a flag, in help order (--finetune-max-steps after --preset).
_OVERRIDES = tuple(name for name in FINETUNE_FLAGS if name != "max_steps")
#: ExperimentConfig's fields that say which donor (DonorRequest's fields, and the device).
_DONOR = ("dataset", "variant", "n_facts", "data_seed", "shuffle", "device")
_OUT_HELP = (
    "Output folder [default: <workspace>/finetuned/<model>/<dataset>/<set>/<preset>, where "
    "the experiments look for their donors]."
)


@click.command(
    "finetune",
    cls=common.GraftCommand,
    sections=dict.fromkeys(
        (*FINETUNE_FLAGS, "preset", "device", "skip_memory_check", "dry_run"), _FINETUNING
    ),
)
@common.with_options(
    [
        *(common.field_option(FinetuneConfig, name) for name in _OVERRIDES),
        common.model_option(),
        common.field_option(ExperimentConfig, "dataset"),
        common.variant_option(what="the model to train", default="one"),
        *(common.field_option(ExperimentConfig, name) for name in (*_DONOR[2:], "preset")),
        common.field_option(FinetuneConfig, "max_steps"),
        common.field_option(ExperimentConfig, "skip_memory_check"),
        cli_only_option("dry_run"),
        click.option("--out", type=click.Path(file_okay=False, path_type=Path), help=_OUT_HELP),
        common.field_option(ExperimentConfig, "workspace"),
        common.quiet_option(),
        common.report_to_option(),
    ]
)
def finetune(
    model, preset, out, workspace, quiet, skip_memory_check, dry_run, report_to, **options
) -> None:
    """Finetune MODEL on a fact dataset; writes model, configs and eval.json (SFT vs PRE).

    Says last whether the model knows its facts: acc@5 on the prompts of the direction(s) it
    was trained on at least 0.10 above the pretrained model's; the experiments stop before
    grafting from one that does not (unless --allow-weak-donor).

    An interrupted run resumes from its last checkpoint; a finished one is not redone.
    A finetune whose memory plan (--dry-run prints it) does not fit the device's free memory
    is refused before the model loads, with the setting that makes it fit
    (--skip-memory-check runs it anyway).
    """
    common.check_dataset_options(options["dataset"])
    donor = {name: options.pop(name) for name in _DONOR}
    config = study.resolve_config(preset, device=donor["device"], **options)  # the overrides
    request = study.DonorRequest(model, config=config, **donor)
    if dry_run:
        common.echo_plan(study.donor_job_lines(request, workspace, out))
        return
    with common.finetune_reporting(report_to, workspace):
        folder = study.run_donor_job(
            request, workspace, out, check_memory=not skip_memory_check, quiet=quiet
        )
    for line in study.trained_model_lines(folder):
        click.echo(line)


if __name__ == "__main__":
    common.standalone(finetune)
