"""``graft-exp finetune``: finetune a base model on a fact dataset (the SFT donor).

It takes the experiments' vocabulary (``--dataset``, ``--variant``, ``--n-facts``,
``--data-seed``, ``--preset``, ``--finetune-max-steps``, ``--workspace``, ``--device``), so
``graft-exp finetune --variant task`` trains exactly the donor ``graft-exp hybrid`` would.
"""

from __future__ import annotations

from pathlib import Path

import click

from experiments.common import (
    GraftCommand,
    check_dataset_options,
    data_seed_option,
    dataset_option,
    device_option,
    finetune_max_steps_option,
    model_option,
    n_facts_option,
    preset_option,
    quiet_option,
    silence_library_progress,
    variant_option,
    workspace_option,
)
from graft.errors import GraftError
from graft.models import ModelNotFoundError, resolve_model_name
from graft.study import data as graft_data
from graft.study import finetune as ft


def _dataset_folder(
    dataset: str, variant: str, n_facts: int | None, data_seed: int, workspace: Path
) -> Path:
    """The folder ``--dataset`` names, generating a data kind into the workspace."""
    direction, train_set = ft.parse_variant(variant)
    if Path(dataset).is_dir():
        folder = Path(dataset)
        if not (folder / "train.jsonl").is_file():
            raise click.BadParameter(f"{folder} has no train.jsonl", param_hint="--dataset")
        manifest = folder / "manifest.json"
        stored = graft_data.load_manifest(folder).get("direction") if manifest.is_file() else None
        if stored not in (None, direction):
            raise click.BadParameter(
                f"{folder} has direction {stored!r}; --variant {variant} needs {direction!r}",
                param_hint="--dataset",
            )
        return folder
    if dataset not in graft_data.KINDS or dataset == "custom":
        raise click.BadParameter(
            f"{dataset!r} is neither a dataset folder nor a data kind "
            f"({', '.join(k for k in graft_data.KINDS if k != 'custom')})",
            param_hint="--dataset",
        )
    return ft.workspace_dataset(
        dataset,
        direction,
        train_set is not None,
        n_facts=n_facts,
        seed=data_seed,
        workspace=workspace,
    )


_FINETUNING = "Finetuning"


@click.command(
    "finetune",
    cls=GraftCommand,
    sections=dict.fromkeys(
        (
            "preset",
            "finetune_max_steps",
            "learning_rate",
            "epochs",
            "batch_size",
            "weight_decay",
            "train_seed",
            "generic_corpus",
            "device",
        ),
        _FINETUNING,
    ),
)
@click.option(
    "--lr",
    "learning_rate",
    type=click.FloatRange(0, min_open=True),
    help="Override the preset's learning rate.",
)
@click.option(
    "--epochs", type=click.FloatRange(0, min_open=True), help="Override the preset's epochs."
)
@click.option(
    "--batch-size",
    type=click.IntRange(1),
    help="Override the preset's batch size: training texts per optimisation step.",
)
@click.option(
    "--weight-decay", type=click.FloatRange(0), help="Override the preset's weight decay."
)
@click.option(
    "--train-seed",
    type=click.IntRange(0),
    help="Seed of the validation split, data order and generic-text sample [default: 0].",
)
@click.option(
    "--generic-corpus",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Generic text mixed in by the gentle preset [default: the shipped corpus].",
)
@model_option()
@dataset_option()
@variant_option(what="the model to train")
@n_facts_option()
@data_seed_option()
@device_option()
@preset_option()
@finetune_max_steps_option()
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Output folder [default: <workspace>/finetuned/<model>/<dataset>/<set>/<preset>, "
    "where the experiments look for their donors].",
)
@workspace_option()
@quiet_option()
def finetune(
    learning_rate: float | None,
    epochs: float | None,
    batch_size: int | None,
    weight_decay: float | None,
    train_seed: int | None,
    generic_corpus: Path | None,
    model: str,
    dataset: str,
    variant: str,
    n_facts: int | None,
    data_seed: int,
    device: str | None,
    preset: str | None,
    finetune_max_steps: int | None,
    out: Path | None,
    workspace: str | None,
    quiet: bool,
) -> None:
    """Finetune MODEL on a fact dataset; writes model, configs and eval.json (SFT vs PRE).

    An interrupted run resumes from its last checkpoint; a finished one is not redone.
    """
    if quiet:
        silence_library_progress()

    try:
        resolve_model_name(model)
    except ModelNotFoundError as err:
        raise click.BadParameter(str(err), param_hint="--model") from None
    check_dataset_options(dataset)
    ws = Path(workspace) if workspace is not None else ft.default_workspace()
    try:
        cfg = ft.resolve_config(
            preset or ft.default_preset(device),
            learning_rate=learning_rate,
            epochs=epochs,
            batch_size=batch_size,
            weight_decay=weight_decay,
            max_steps=finetune_max_steps,
            seed=train_seed,
            generic_corpus=str(generic_corpus) if generic_corpus is not None else None,
        )
        folder = _dataset_folder(dataset, variant, n_facts, data_seed, ws)
        _, train_set = ft.parse_variant(variant)
        if out is None:
            out = ft.finetuned_dir(model, folder, train_set, cfg, ws)
        ft.finetune(model, folder, out, cfg, train_set=train_set, device=device, quiet=quiet)
    except GraftError as err:
        raise click.UsageError(str(err)) from None
