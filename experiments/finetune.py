"""``graft-exp finetune``: finetune a base model on a fact dataset (the SFT donor).

It takes the experiments' vocabulary (``--dataset``, ``--variant``, ``--n-facts``,
``--data-seed``, ``--shuffle``, ``--preset``, ``--finetune-max-steps``, ``--workspace``,
``--device``), so ``graft-exp finetune --variant task`` trains exactly the donor
``graft-exp hybrid`` would.
"""

from __future__ import annotations

from pathlib import Path

import click

from graft.study import (
    DonorRequest,
    ExperimentConfig,
    FinetuneConfig,
    donor_job_lines,
    resolve_config,
    run_donor_job,
)
from graft_experiments.common import (
    GraftCommand,
    check_dataset_options,
    echo_plan,
    field_option,
    model_option,
    quiet_option,
    standalone,
    variant_option,
    with_options,
)
from graft_experiments.options import FINETUNE_FLAGS, cli_only_option

_FINETUNING = "Finetuning"
#: FinetuneConfig's fields with a flag, in help order (--finetune-max-steps after --preset).
_OVERRIDES = (
    "learning_rate",
    "epochs",
    "batch_size",
    "weight_decay",
    "seed",
    "generic_corpus",
    "weights_dtype",
    "gradient_checkpointing",
)


@click.command(
    "finetune",
    cls=GraftCommand,
    sections=dict.fromkeys(
        (*FINETUNE_FLAGS, "preset", "device", "skip_memory_check", "dry_run"), _FINETUNING
    ),
)
@with_options(
    [
        *(field_option(FinetuneConfig, name) for name in _OVERRIDES),
        model_option(),
        field_option(ExperimentConfig, "dataset"),
        variant_option(what="the model to train", default="one"),
        field_option(ExperimentConfig, "n_facts"),
        field_option(ExperimentConfig, "data_seed"),
        field_option(ExperimentConfig, "shuffle"),
        field_option(ExperimentConfig, "device"),
        field_option(ExperimentConfig, "preset"),
        field_option(FinetuneConfig, "max_steps"),
        field_option(ExperimentConfig, "skip_memory_check"),
        cli_only_option("dry_run"),
        click.option(
            "--out",
            type=click.Path(file_okay=False, path_type=Path),
            help="Output folder [default: <workspace>/finetuned/<model>/<dataset>/<set>/"
            "<preset>, where the experiments look for their donors].",
        ),
        field_option(ExperimentConfig, "workspace"),
        quiet_option(),
    ]
)
def finetune(
    model: str,
    dataset: str,
    variant: str,
    n_facts: int | None,
    data_seed: int,
    shuffle: str,
    device: str | None,
    preset: str | None,
    out: Path | None,
    workspace: str | None,
    quiet: bool,
    skip_memory_check: bool,
    dry_run: bool,
    **overrides,
) -> None:
    """Finetune MODEL on a fact dataset; writes model, configs and eval.json (SFT vs PRE).

    An interrupted run resumes from its last checkpoint; a finished one is not redone.
    A finetune whose memory plan (--dry-run prints it) does not fit the device's free memory
    is refused before the model loads, with the setting that makes it fit
    (--skip-memory-check runs it anyway).
    """
    check_dataset_options(dataset)
    if Path(dataset).is_dir() and not (Path(dataset) / "train.jsonl").is_file():
        # checked here because Workspace.locate_donor reads train.jsonl before checking it
        raise click.BadParameter(f"{dataset} has no train.jsonl", param_hint="--dataset")
    # a GraftError becomes one line (GraftCommand)
    config = resolve_config(preset, device=device, **overrides)
    request = DonorRequest(
        model,
        dataset,
        variant,
        config,
        n_facts=n_facts,
        data_seed=data_seed,
        shuffle=shuffle,
        device=device,
    )
    if dry_run:
        echo_plan(donor_job_lines(request, workspace, out))
        return
    run_donor_job(request, workspace, out, check_memory=not skip_memory_check, quiet=quiet)


if __name__ == "__main__":
    standalone(finetune)
