"""Options every experiment command shares, and the glue from options to graft.runner."""

from __future__ import annotations

import functools
from collections.abc import Callable

import click

from graft.data import KINDS
from graft.errors import GraftError
from graft.finetune import PRESETS
from graft.models import DEFAULT_MODEL
from graft.remote import RemoteError, remote_options
from graft.runner import ExperimentConfig, ExperimentRun, print_summary
from graft.spec import HEAD_POLICIES

DATASET_HELP = f"Data kind ({', '.join(k for k in KINDS if k != 'custom')}) or a dataset folder."


def _csv(ctx, param, value):
    if value is None:
        return None
    items = tuple(v.strip() for v in value.split(",") if v.strip())
    if not items:
        raise click.BadParameter("give at least one comma-separated value")
    return items


def silence_library_progress() -> None:
    """``--quiet``: also hide transformers' own bars (weight loading, checkpoint writing)."""
    import transformers

    transformers.utils.logging.disable_progress_bar()


def shared_options(func: Callable) -> Callable:
    """Add the shared options; the command receives ``cfg_options`` (a dict) and ``remote``."""
    names = (
        "model",
        "dataset",
        "n_facts",
        "data_seed",
        "preset",
        "finetune_max_steps",
        "templates",
        "n",
        "batch_size",
        "device",
        "dtype",
        "seed",
        "out",
        "head_policy",
        "workspace",
        "overwrite",
        "n_boot",
        "quiet",
    )

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        opts = {k: kwargs.pop(k) for k in names}
        opts["progress"] = not opts.pop("quiet")
        if not opts["progress"]:
            silence_library_progress()
        return func(*args, cfg_options=opts, **kwargs)

    options = [
        click.option(
            "--model",
            default=DEFAULT_MODEL,
            show_default=True,
            help="Registry name (smollm2-135m, gemma3-270m, gpt2-xl, llama3.2-1b, tiny-llama, ...), hub id or model folder.",
        ),
        click.option(
            "--dataset", default="fake_movies_real_actors", show_default=True, help=DATASET_HELP
        ),
        click.option(
            "--n-facts",
            type=click.IntRange(1),
            default=None,
            help="Facts per set when the dataset is generated [default: 50].",
        ),
        click.option(
            "--data-seed",
            type=int,
            default=0,
            show_default=True,
            help="Seed of the generated dataset.",
        ),
        click.option(
            "--preset",
            type=click.Choice(sorted(PRESETS)),
            default=None,
            help="Finetune preset of donors that must be finetuned first [default: paper on "
            "CUDA, else cpu].",
        ),
        click.option(
            "--finetune-max-steps",
            type=click.IntRange(1),
            default=None,
            help="Cap finetune steps (quick trials); default: the preset's.",
        ),
        click.option(
            "--templates",
            callback=_csv,
            default=None,
            help="Comma-separated test templates (headline,qa,movie) [default: all].",
        ),
        click.option(
            "--n",
            type=click.IntRange(1),
            default=None,
            help="Examples per template (seeded sample) [default: all].",
        ),
        click.option(
            "--batch-size",
            type=click.IntRange(1),
            default=32,
            show_default=True,
            help="(prompt, graft) rows per forward pass.",
        ),
        click.option(
            "--device", default=None, help="cpu, cuda, cuda:1 ... [default: cuda if available]."
        ),
        click.option(
            "--dtype",
            type=click.Choice(["float32", "float16", "bfloat16", "float64"]),
            default=None,
            help="[default: float32 on CPU, bfloat16 on CUDA]",
        ),
        click.option(
            "--seed", type=int, default=0, show_default=True, help="Sampling and bootstrap seed."
        ),
        click.option(
            "--out",
            type=click.Path(file_okay=False),
            default=None,
            help="Run folder [default: runs/<experiment>/<model>-<dataset>-seed<seed>]; a rerun resumes it.",
        ),
        click.option(
            "--head-policy",
            type=click.Choice(HEAD_POLICIES),
            default="base",
            show_default=True,
            help="Readout of grafted runs: base head (paper's text), donor head, or as the paper's code did.",
        ),
        click.option(
            "--workspace",
            type=click.Path(file_okay=False),
            default=None,
            help="Datasets and finetuned models [default: $GRAFT_WORKSPACE or ./workspace].",
        ),
        click.option(
            "--overwrite",
            is_flag=True,
            help="Discard an existing run in --out instead of resuming it.",
        ),
        click.option(
            "--n-boot",
            type=click.IntRange(10),
            default=1000,
            show_default=True,
            help="Bootstrap resamples for the 95% CIs.",
        ),
        click.option("--quiet", is_flag=True, help="No progress bars."),
    ]
    for option in reversed(options):
        wrapper = option(wrapper)
    return remote_options(wrapper)


def make_config(experiment: str, cfg_options: dict, remote, **extra) -> ExperimentConfig:
    return ExperimentConfig(experiment=experiment, remote=remote, **cfg_options, **extra)


def run_and_report(fn: Callable[[], ExperimentRun], metric: str = "acc@5") -> ExperimentRun:
    """Run an experiment; bad input becomes a one-line usage error (exit 2)."""
    try:
        run = fn()
    except RemoteError as err:
        raise click.ClickException(str(err)) from None
    except GraftError as err:
        raise click.UsageError(str(err)) from None
    print_summary(run.summary, metric, echo=click.echo)
    click.echo(f"results: {run.folder.path}")
    return run
