"""``graft-exp finetune``: finetune a base model on a fact dataset (the SFT donor)."""

from __future__ import annotations

from pathlib import Path

import click

from experiments.common import silence_library_progress
from graft import data as graft_data
from graft import finetune as ft
from graft.models import DEFAULT_MODEL, ModelNotFoundError, resolve_model_name

_KINDS = [k for k in graft_data.KINDS if k != "custom"]


@click.command("finetune")
@click.option(
    "--model",
    default=DEFAULT_MODEL,
    show_default=True,
    help="Registry name (smollm2-135m, gemma3-270m, gpt2-xl, tiny-llama, ...), hub id or model folder.",
)
@click.option(
    "--dataset",
    type=click.Path(path_type=Path),
    help="Dataset folder (train.jsonl, test_prompts.jsonl, manifest.json). Default: generate one into the workspace.",
)
@click.option(
    "--data-kind",
    type=click.Choice(_KINDS),
    help="Generate this kind of dataset into the workspace [default: fake_movies_real_actors].",
)
@click.option(
    "--direction",
    type=click.Choice(graft_data.DIRECTIONS),
    help="Generated data: one direction, or both (adds the swapped renderings) [default: one].",
)
@click.option(
    "--split",
    "train_set",
    type=click.Choice(["A", "B"]),
    help="Split data into disjoint fact sets and train on A (task model) or B (relation model).",
)
@click.option("--n-facts", type=int, help="Generated data: facts per set [default: 50].")
@click.option("--data-seed", type=int, default=0, show_default=True, help="Generated data: seed.")
@click.option(
    "--preset",
    type=click.Choice(list(ft.PRESETS)),
    help="Hyper-parameters: paper, gentle, or cpu (small models on a CPU). [default: paper on CUDA, else cpu]",
)
@click.option("--lr", "learning_rate", type=float, help="Override the preset's learning rate.")
@click.option("--epochs", type=float, help="Override the preset's number of epochs.")
@click.option("--batch-size", type=int, help="Override the preset's batch size.")
@click.option("--weight-decay", type=float, help="Override the preset's weight decay.")
@click.option("--max-steps", type=int, help="Stop after this many optimisation steps.")
@click.option("--seed", type=int, help="Training seed [default: 0].")
@click.option(
    "--generic-corpus",
    type=click.Path(path_type=Path),
    help="Generic text mixed in by the gentle preset [default: the shipped corpus].",
)
@click.option(
    "--workspace",
    type=click.Path(path_type=Path),
    help="Workspace folder [default: $GRAFT_WORKSPACE or ./workspace].",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="Output folder [default: <workspace>/finetuned/<model>/<dataset>/<set>/<preset>].",
)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), help="[default: cuda when available]")
@click.option("--quiet", is_flag=True, help="No progress bars.")
def finetune(
    model: str,
    dataset: Path | None,
    data_kind: str | None,
    direction: str | None,
    train_set: str | None,
    n_facts: int | None,
    data_seed: int,
    preset: str | None,
    learning_rate: float | None,
    epochs: float | None,
    batch_size: int | None,
    weight_decay: float | None,
    max_steps: int | None,
    seed: int | None,
    generic_corpus: Path | None,
    workspace: Path | None,
    out: Path | None,
    device: str | None,
    quiet: bool,
) -> None:
    """Finetune MODEL on a fact dataset; writes model, configs and eval.json (SFT vs PRE).

    An interrupted run resumes from its last checkpoint; a finished one is not redone.
    """
    if quiet:
        silence_library_progress()
    import torch

    try:
        resolve_model_name(model)
    except ModelNotFoundError as err:
        raise click.BadParameter(str(err), param_hint="--model") from None
    if dataset is not None and (data_kind or direction or n_facts is not None or data_seed):
        raise click.UsageError(
            "pass either --dataset or --data-kind/--direction/--n-facts/--data-seed"
        )
    if device == "cuda" and not torch.cuda.is_available():
        raise click.BadParameter("CUDA is not available here", param_hint="--device")
    on_cuda = device == "cuda" or (device is None and torch.cuda.is_available())
    ws = workspace if workspace is not None else ft.default_workspace()
    try:
        cfg = ft.resolve_config(
            preset or ("paper" if on_cuda else "cpu"),
            learning_rate=learning_rate,
            epochs=epochs,
            batch_size=batch_size,
            weight_decay=weight_decay,
            max_steps=max_steps,
            seed=seed,
            generic_corpus=str(generic_corpus) if generic_corpus is not None else None,
        )
        if dataset is None:
            dataset = ft.workspace_dataset(
                data_kind or "fake_movies_real_actors",
                direction or "one",
                train_set is not None,
                n_facts=n_facts,
                seed=data_seed,
                workspace=ws,
            )
        elif not (dataset / "train.jsonl").is_file():
            raise click.BadParameter(f"{dataset} has no train.jsonl", param_hint="--dataset")
        if out is None:
            out = ft.finetuned_dir(model, dataset, train_set, cfg, ws)
        ft.finetune(model, dataset, out, cfg, train_set=train_set, device=device, quiet=quiet)
    except (ft.FinetuneError, ModelNotFoundError) as err:
        raise click.UsageError(str(err)) from None
