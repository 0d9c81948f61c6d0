"""The command-line vocabulary of ``graft-exp``, and the glue from options to graft.study.runner.

Every option that more than one command takes is declared once here (name, type, range,
default, help), so it means the same thing in every command; the README's "Command-line
vocabulary" table lists them. Where a meaning differs, the name differs too (an experiment's
``--rows-per-forward`` is not a finetune's ``--batch-size``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import click
from click.core import ParameterSource

from graft.core.spec import HEAD_POLICIES
from graft.errors import GraftError
from graft.models import DEFAULT_MODEL
from graft.remote.client import RemoteError, remote_options
from graft.study.data import DEFAULT_N_FACTS, DIRECTIONS, KINDS
from graft.study.finetune import PRESETS, VARIANT_ALIASES
from graft.study.runner import ExperimentConfig, ExperimentRun, print_summary

DATA_KINDS = tuple(k for k in KINDS if k != "custom")
#: Donor variants: the direction of the training data, and the fact set of a split dataset.
VARIANTS = (
    *DIRECTIONS,
    *VARIANT_ALIASES,
    *(f"{direction}-{fact_set}" for direction in DIRECTIONS for fact_set in "AB"),
)
VARIANT_HELP = (
    "one (trained on one direction), both (also the swapped renderings), task (= one-A: "
    "fact set A of a split dataset), relation (= one-B), one-A, one-B, both-A, both-B."
)
DATASET_HELP = (
    f"Data kind ({', '.join(DATA_KINDS)}), generated into the workspace, or a dataset folder."
)

# Help sections, in print order after the command's own options ("Options").
MODEL_DATA = "Model and data"
RUN = "Run"
DONORS = "Donor finetuning (when a donor is missing from the workspace)"
OUTPUT = "Output"
REMOTE = "Remote execution (only with --remote)"
SECTIONS = (MODEL_DATA, RUN, DONORS, OUTPUT, REMOTE)
REMOTE_PARAMS = (
    "remote_flag",
    "ndif_host",
    "ndif_model_key",
    "donor_mode",
    "hosted_donor",
    "max_payload_mb",
    "remote_timeout",
    "remote_retries",
)
SECTION_OF: dict[str, str] = {
    **dict.fromkeys(
        ("model", "dataset", "n_facts", "data_seed", "templates", "n", "variant"),
        MODEL_DATA,
    ),
    **dict.fromkeys(("batch_size", "device", "dtype", "seed", "n_boot", "head_policy"), RUN),
    **dict.fromkeys(("preset", "finetune_max_steps"), DONORS),
    **dict.fromkeys(("out", "workspace", "overwrite", "quiet"), OUTPUT),
    **dict.fromkeys(REMOTE_PARAMS, REMOTE),
}


class GraftCommand(click.Command):
    """A command whose ``--help`` groups the shared options under headings (:data:`SECTIONS`);
    the command's own options come first, under "Options".

    Args (besides click.Command's):
        sections: parameter name -> heading, overriding :data:`SECTION_OF` for this command.
    """

    def __init__(self, *args, sections: dict[str, str] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.section_of = {**SECTION_OF, **(sections or {})}

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        groups: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                title = self.section_of.get(param.name or "", "Options")
                groups.setdefault(title, []).append(record)
        own = [t for t in groups if t not in ("Options", *SECTIONS)]  # from ``sections``
        titles = [MODEL_DATA, *own, *SECTIONS[1:]]
        # the command's own options first; "Options" holding only --help goes last
        if len(groups.get("Options", [])) > 1:
            titles.insert(0, "Options")
        else:
            titles.append("Options")
        for title in titles:
            if groups.get(title):
                with formatter.section(title):
                    formatter.write_dl(groups[title])


class DeviceType(click.ParamType):
    """``cpu``, ``cuda``, ``cuda:N``: checked against this machine when the option is parsed."""

    name = "device"

    def convert(self, value, param, ctx):
        from graft.models import DeviceError, resolve_device

        try:
            resolve_device(value)
        except DeviceError as err:
            self.fail(str(err), param, ctx)
        return str(value)


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


# ------------------------------------------------------------- options of several commands


def model_option() -> Callable:
    return click.option(
        "--model",
        default=DEFAULT_MODEL,
        show_default=True,
        help="Registry name (smollm2-135m, gemma3-270m, gpt2-xl, llama3.2-1b, tiny-llama, ...), "
        "hub id or model folder.",
    )


def dataset_option() -> Callable:
    return click.option(
        "--dataset", default="fake_movies_real_actors", show_default=True, help=DATASET_HELP
    )


def n_facts_option(*dest: str) -> Callable:
    """``--n-facts``; ``dest`` renames the callback's parameter."""
    return click.option(
        "--n-facts",
        *dest,
        type=click.IntRange(1),
        default=None,
        help=f"Facts per set of a generated dataset [default: {DEFAULT_N_FACTS}; data --facts: "
        "every usable row].",
    )


def data_seed_option(*dest: str) -> Callable:
    """``--data-seed``; ``dest`` renames the callback's parameter."""
    return click.option(
        "--data-seed",
        *dest,
        type=click.IntRange(0),
        default=0,
        show_default=True,
        help="Seed of a generated dataset (Faker and every shuffle).",
    )


def variant_option(default: str = "one", what: str = "the donor") -> Callable:
    """``--variant``: the finetune data variant of ``what``."""
    return click.option(
        "--variant",
        type=click.Choice(VARIANTS),
        default=default,
        show_default=True,
        help=f"Finetune data variant of {what}: {VARIANT_HELP}",
    )


def preset_option() -> Callable:
    return click.option(
        "--preset",
        type=click.Choice(sorted(PRESETS)),
        default=None,
        help="Finetune hyper-parameters: paper, gentle (C.4, generic text mixed in) or cpu "
        "(small models on a CPU) [default: paper when training on CUDA, else cpu].",
    )


def finetune_max_steps_option() -> Callable:
    return click.option(
        "--finetune-max-steps",
        type=click.IntRange(1),
        default=None,
        help="Stop a finetune after this many optimisation steps (quick trials) "
        "[default: the preset's epochs].",
    )


def device_option() -> Callable:
    return click.option(
        "--device",
        type=DeviceType(),
        default=None,
        help="cpu, cuda or cuda:N [default: cuda if available, else cpu].",
    )


def workspace_option(*dest: str) -> Callable:
    """``--workspace``; ``dest`` renames the callback's parameter."""
    return click.option(
        "--workspace",
        *dest,
        type=click.Path(file_okay=False),
        default=None,
        help="Datasets (<workspace>/datasets) and finetuned models (<workspace>/finetuned) "
        "[default: $GRAFT_WORKSPACE or ./workspace].",
    )


def quiet_option() -> Callable:
    return click.option("--quiet", is_flag=True, help="No progress bars.")


def apply_options(func: Callable, options: list[Callable]) -> Callable:
    """Decorate ``func`` so that ``options`` appear in ``--help`` in list order."""
    for option in reversed(options):
        func = option(func)
    return func


def given(name: str) -> bool:
    """Whether the current command's option ``name`` was given (not its default)."""
    source = click.get_current_context().get_parameter_source(name)
    return source not in (None, ParameterSource.DEFAULT)


def check_dataset_options(dataset: str) -> None:
    """``--n-facts`` and ``--data-seed`` describe a generated dataset, not a folder."""
    if Path(dataset).is_dir() and (given("n_facts") or given("data_seed")):
        raise click.UsageError(
            f"--n-facts and --data-seed describe a generated dataset; {dataset} is a dataset "
            "folder: drop them (or pass a data kind to --dataset)"
        )


# ------------------------------------------------------------------- experiment commands

SHARED_NAMES = (
    "model",
    "dataset",
    "n_facts",
    "data_seed",
    "templates",
    "n",
    "batch_size",
    "device",
    "dtype",
    "seed",
    "n_boot",
    "head_policy",
    "preset",
    "finetune_max_steps",
    "out",
    "workspace",
    "overwrite",
    "quiet",
)


def shared_options(func: Callable) -> Callable:
    """Add the shared options; the command receives ``cfg_options`` (a dict) and ``remote``.

    In ``--help`` they follow the command's own options; the remote options come last.
    """
    with_remote = remote_options(func)

    @functools.wraps(with_remote)
    def wrapper(*args, **kwargs):
        opts = {k: kwargs.pop(k) for k in SHARED_NAMES}
        check_dataset_options(opts["dataset"])
        opts["progress"] = not opts.pop("quiet")
        if not opts["progress"]:
            silence_library_progress()
        return with_remote(*args, cfg_options=opts, **kwargs)

    options = [
        model_option(),
        dataset_option(),
        n_facts_option(),
        data_seed_option(),
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
            help="Examples per template (sampled with --seed) [default: all].",
        ),
        click.option(
            "--rows-per-forward",
            "batch_size",
            type=click.IntRange(1),
            default=32,
            show_default=True,
            help="(prompt, graft) rows per forward pass: memory vs speed, results unchanged.",
        ),
        device_option(),
        click.option(
            "--dtype",
            type=click.Choice(["float32", "float16", "bfloat16", "float64"]),
            default=None,
            help="Dtype the models run in [default: float32 on CPU, bfloat16 on CUDA].",
        ),
        click.option(
            "--seed",
            type=click.IntRange(0),
            default=0,
            show_default=True,
            help="Seed of the example sample (--n) and of the bootstrap CIs.",
        ),
        click.option(
            "--n-boot",
            type=click.IntRange(10, 100_000),
            default=1000,
            show_default=True,
            help="Bootstrap resamples for the 95% CIs.",
        ),
        click.option(
            "--head-policy",
            type=click.Choice(HEAD_POLICIES),
            default="base",
            show_default=True,
            help="Readout of grafted runs: base head (paper's text), donor head, or as the "
            "paper's code did.",
        ),
        preset_option(),
        finetune_max_steps_option(),
        click.option(
            "--out",
            type=click.Path(file_okay=False),
            default=None,
            help="Run folder [default: runs/<experiment>/<model>-<dataset>-seed<seed>]; a "
            "rerun resumes it.",
        ),
        workspace_option(),
        click.option(
            "--overwrite",
            is_flag=True,
            help="Discard an existing run in --out instead of resuming it.",
        ),
        quiet_option(),
    ]
    return apply_options(wrapper, options)


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
