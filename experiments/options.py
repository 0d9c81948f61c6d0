"""The command line's face of the config dataclasses: one table, keyed by field name.

Each entry of :data:`FLAGS` says how one field of :class:`~graft.study.running.runner.ExperimentConfig`,
:class:`~graft.study.specs.presets.FinetuneConfig` or :class:`~graft.remote.config.RemoteConfig` is
given on the command line: its flag, click type (range, choice), help and, where the command
line says "not given" differently from the field, its default; otherwise the default is the
field's own. The click parameter is named after the field, so a command hands its values to
the dataclass as they are. :data:`CLI_ONLY` names the flags that are no field; ``tests/cli/test_options.py`` fails when
a field has no flag here and no reason in its ``NOT_ON_CLI``, or an entry names no field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import click

from graft.core import COUNT, HEAD_POLICIES, PROTOCOLS, SEED
from graft.remote import DONOR_MODES, REMOTE_RANGES, RemoteConfig
from graft.study import (
    EXPERIMENT_RANGES,
    FINETUNE_RANGES,
    GENERATED_KINDS,
    PRESETS,
    STEPS,
    WEIGHTS_DTYPES,
    AttributionRequest,
    DatasetConfig,
    ExperimentConfig,
    FinetuneConfig,
)
from graft_experiments.click_types import (
    DTYPES,
    FIELD_DEFAULT,
    DeviceType,
    Flag,
    csv_list,
    name_sources,
    number_type,
    remote_mode_flag,
    seed_list,
)
from graft_experiments.command_flags import (
    ATTRIBUTION_FLAGS,
    DATA_SEED,
    DATASET_FLAGS,
    N_FACTS,
    SHUFFLE,
)

_FINETUNE_SEED_HELP = "validation split, data order and initialisation"
_MAX_STEPS = Flag(
    "--finetune-max-steps",
    "Stop a finetune after this many optimisation steps (quick trials) "
    "[default: the preset's epochs].",
    number_type(STEPS),
    default=None,
)

#: ``--generic-corpus`` of the experiments and of ``graft-exp finetune`` (the same donor).
_GENERIC_CORPUS = Flag(
    "--generic-corpus",
    "Generic text the gentle preset mixes in: a file (one passage per line, or JSONL with "
    "text) or stand-in (graft's 61 shipped passages) [default: the paper's openwebtext + "
    "IMDB sample from the hub (pip install 'graft-interp[corpus]'), else the stand-in, with a "
    "warning].",
    click.Path(dir_okay=False),
    None,
)

EXPERIMENT_FLAGS: dict[str, Flag] = {
    "model": Flag(
        "--model",
        "Registry name (smollm2-135m, gemma3-270m, gpt2-xl, llama3.2-1b, tiny-llama, ...), "
        "hub id or model folder.",
    ),
    "dataset": Flag(
        "--dataset",
        f"Data kind ({', '.join(GENERATED_KINDS)}), generated into the workspace, or a dataset folder.",
    ),
    "n_facts": N_FACTS,
    "data_seed": DATA_SEED,
    "shuffle": SHUFFLE,
    "data_seeds": Flag(
        "--data-seeds",
        "Comma-separated data seeds, e.g. 0,1,2: one generated dataset (test prompts and the "
        "facts the donors learn) per seed, crossed with --finetune-seeds; the summary adds "
        "the mean over replicates. Replaces --data-seed.",
        extra={"callback": seed_list, "metavar": "S,S,..."},
    ),
    "finetune_seeds": Flag(
        "--finetune-seeds",
        "Comma-separated finetune seeds, e.g. 0,1,2: every finetuned model of the run is "
        f"trained once per seed ({_FINETUNE_SEED_HELP}; as finetune's --finetune-seed) and "
        "every graft runs on each; the summary adds the mean over seeds with a "
        "between-seed interval [default: 0, the presets' seed].",
        extra={"callback": seed_list, "metavar": "S,S,..."},
    ),
    "control": Flag(
        "--control",
        "Also run the grafts with control models: per seed, the same variant and preset "
        "finetuned on a dataset of the same kind with data seed + 1000 (other facts); "
        "their grafts are named '<graft> [control]' and each key graft is contrasted with "
        "its control twin.",
        extra={"is_flag": True},
    ),
    "templates": Flag(
        "--templates",
        "Comma-separated test templates (headline,qa,movie) [default: all].",
        extra={"callback": csv_list},
    ),
    "n": Flag(
        "--n", "Examples per template (sampled with --seed) [default: all].", number_type(COUNT)
    ),
    "batch_size": Flag(
        "--rows-per-forward",
        "(prompt, graft) rows per forward pass: memory vs speed, results unchanged.",
        number_type(COUNT),
    ),
    "device": Flag(
        "--device", "cpu, cuda or cuda:N [default: cuda if available, else cpu].", DeviceType()
    ),
    "dtype": Flag(
        "--dtype",
        "Dtype the models run in [default: float32 on CPU, bfloat16 on CUDA; float32 on "
        "every device under --protocol paper].",
        click.Choice(DTYPES),
    ),
    "seed": Flag(
        "--seed", "Seed of the example sample (--n) and of the bootstrap CIs.", number_type(SEED)
    ),
    "n_boot": Flag(
        "--n-boot",
        "Bootstrap resamples for the 95% CIs.",
        number_type(EXPERIMENT_RANGES["n_boot"]),
    ),
    "head_policy": Flag(
        "--head-policy",
        "Readout of grafted runs: base head (paper's text), donor head, or as the paper's "
        "code did [default: base; paper under --protocol paper].",
        click.Choice(HEAD_POLICIES),
    ),
    "protocol": Flag(
        "--protocol",
        "graft: graft's defaults; paper: the paper code's setup at once (its training "
        "templates and test wording, both-direction donors, head policy paper, its layer "
        "groups, GPT-2 'all' without pos_embed, its metadata ranges, float32 unless --dtype "
        "says otherwise). See docs/reference/paper_protocol.md.",
        click.Choice(PROTOCOLS),
        PROTOCOLS[0],  # the field's default is the protocol object; the flag gives its name
    ),
    "preset": Flag(
        "--preset",
        "Finetune hyper-parameters: paper, gentle (C.4, generic text mixed in) or cpu "
        "(small models on a CPU) [default: paper when training on CUDA, else cpu].",
        click.Choice(sorted(PRESETS)),
    ),
    "finetune_max_steps": _MAX_STEPS,
    "generic_corpus": _GENERIC_CORPUS,
    "out": Flag(
        "--out",
        "Run folder [default: runs/<experiment>/<model>-<dataset>-seed<seed>]; a rerun resumes it.",
        click.Path(file_okay=False),
    ),
    "workspace": Flag(
        "--workspace",
        "Datasets (<workspace>/datasets) and finetuned models (<workspace>/finetuned) "
        "[default: $GRAFT_WORKSPACE or ./workspace].",
        click.Path(file_okay=False),
    ),
    "overwrite": Flag(
        "--overwrite",
        "Discard an existing run in --out instead of resuming it.",
        extra={"is_flag": True},
    ),
    "skip_memory_check": Flag(
        "--skip-memory-check",
        "Run even when the memory plan (--dry-run) says the run does not fit the device's "
        "free memory; without it such a run is refused before anything loads.",
        extra={"is_flag": True},
    ),
    "allow_weak_donor": Flag(
        "--allow-weak-donor",
        "Graft from a finetuned model that does not know its facts (acc@5 on its trained "
        "direction less than 0.10 above the pretrained model's, by its eval.json); without "
        "it such a run stops before grafting, saying what to change (steps, learning rate, "
        "preset). Recorded in config.json.",
        extra={"is_flag": True},
    ),
    "score_full_name": Flag(
        "--score-full-name",
        "Also score the whole target name, teacher-forced token by token: its log-prob "
        "(name_logprob) and whether greedy decoding gives it exactly (name_exact). One more "
        "row per name token after the first.",
        extra={"is_flag": True},
    ),
}


def _override(decl: str, name: str, what: str = "") -> Flag:
    """The flag of a :class:`FinetuneConfig` number that overrides the preset's."""
    return Flag(
        decl,
        f"Override the preset's {name.replace('_', ' ')}{what}.",
        number_type(FINETUNE_RANGES[name]),
        None,
    )


FINETUNE_FLAGS: dict[str, Flag] = {
    "learning_rate": _override("--lr", "learning_rate"),
    "epochs": _override("--epochs", "epochs"),
    "batch_size": _override("--batch-size", "batch_size", ": training texts per optimisation step"),
    "weight_decay": _override("--weight-decay", "weight_decay"),
    "seed": Flag(
        "--finetune-seed",
        f"Seed of the {_FINETUNE_SEED_HELP} and generic-text sample (an experiment's "
        "--finetune-seeds) [default: 0].",
        number_type(SEED),
        None,
    ),
    "generic_corpus": _GENERIC_CORPUS,
    "max_steps": _MAX_STEPS,
    "weights_dtype": Flag(
        "--weights-dtype",
        "Override the preset's: float32 (master weights and AdamW state, 16 bytes a "
        "parameter) or bfloat16 (8 bytes a parameter; updates below bfloat16's resolution "
        "are lost).",
        click.Choice(WEIGHTS_DTYPES),
        None,
    ),
    "gradient_checkpointing": Flag(
        "--gradient-checkpointing",
        "Recompute activations in the backward pass instead of keeping them (less memory, "
        "about a third more compute).",
        default=None,
        extra={"is_flag": True, "flag_value": True},
    ),
}

REMOTE_FLAGS: dict[str, Flag] = {
    "mode": Flag(
        "--remote",
        "Run the grafted forward passes on an NDIF server (nnsight's remote client); donors "
        "are still finetuned and loaded here (--dry-run plans both parts).",
        default=False,
        extra={"is_flag": True, "callback": remote_mode_flag},
    ),
    "host": Flag(
        "--ndif-host",
        "NDIF server URL [default: env NDIF_HOST, else nnsight's host]. The API key is read "
        "from env NDIF_API_KEY.",
        extra={"metavar": "URL"},
    ),
    "model_key": Flag(
        "--ndif-model-key",
        "Model key the server knows the model by [default: derived from the base's hub id].",
        extra={"metavar": "KEY"},
    ),
    "donor_mode": Flag(
        "--donor-mode",
        "ship: send the grafted donor modules with each request; hosted: the server holds a "
        "graft pair (graft.remote.hosted.GraftPairModel), only ids travel.",
        click.Choice(DONOR_MODES),
    ),
    "hosted_donors": Flag(
        "--hosted-donor",
        "Hosted mode: a donor the server holds (hub id or server path), to derive the "
        "graft-pair model key.",
        default=(),
        extra={"multiple": True, "metavar": "NAME=SOURCE", "callback": name_sources},
    ),
    "max_payload_mb": Flag(
        "--max-payload-mb",
        "Largest request payload (ship mode: donor weights); a batch over it is split "
        "between layers, one request per layer block.",
        number_type(REMOTE_RANGES["max_payload_mb"]),
    ),
    "timeout_s": Flag(
        "--remote-timeout",
        "Seconds to wait for one request's result.",
        number_type(REMOTE_RANGES["timeout_s"]),
    ),
    "retries": Flag(
        "--remote-retries",
        "Retries of a request that failed transiently.",
        number_type(REMOTE_RANGES["retries"]),
    ),
}

#: config class -> {field name -> Flag}.
FLAGS: dict[type, dict[str, Flag]] = {
    AttributionRequest: ATTRIBUTION_FLAGS,
    DatasetConfig: DATASET_FLAGS,
    ExperimentConfig: EXPERIMENT_FLAGS,
    FinetuneConfig: FINETUNE_FLAGS,
    RemoteConfig: REMOTE_FLAGS,
}

#: Flags that are no config field: name -> (decl, help).
CLI_ONLY: dict[str, tuple[str, str]] = {
    "quiet": (
        "--quiet",
        "No progress bars; graft's warnings only (none of its libraries'; run.log keeps all).",
    ),
    "dry_run": (
        "--dry-run",
        "Print the plan (models, rows and batches, the run folder: new, resumed or why the "
        "run would stop there, finetunes and their duration, memory "
        "against the device's free memory, the setting that makes it fit) and exit; nothing "
        "is loaded or written. With --remote: what stays here (finetunes, models loaded), "
        "what the server runs (requests, rows) and what is sent (donor weights, bytes); "
        "nothing is sent.",
    ),
}


def field_default(config: type, name: str) -> Any:
    """The default of ``config``'s field ``name`` (MISSING when it has none)."""
    for f in dataclasses.fields(config):
        if f.name == name:
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
            return f.default
    raise KeyError(f"{config.__name__} has no field {name!r}")  # programming error


def field_option(config: type, name: str, dest: str | None = None, **overrides: Any) -> Callable:
    """The ``click.option`` of ``config``'s field ``name``, from :data:`FLAGS`.

    The parameter is named ``name`` (``dest`` renames it); ``overrides`` (``click.option``
    arguments, e.g. ``help``) adapt it to one command.
    """
    flag = FLAGS[config][name]
    default = flag.default
    if default is FIELD_DEFAULT:
        default = field_default(config, name)
        if default is dataclasses.MISSING:
            default = None
    kwargs: dict[str, Any] = {"type": flag.type, "default": default, "help": flag.help}
    kwargs.update(flag.extra)
    if default not in (None, False, ()) and not kwargs.get("is_flag"):
        kwargs["show_default"] = True
    kwargs.update(overrides)
    return click.option(flag.decl, dest or name, **kwargs)


def cli_only_option(name: str) -> Callable:
    decl, help_text = CLI_ONLY[name]
    return click.option(decl, name, is_flag=True, help=help_text)
