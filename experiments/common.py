"""The command-line vocabulary of ``graft-exp``, and the glue from options to graft.study.running.runner.

Every option that more than one command takes is built from one table,
:mod:`graft_experiments.options` (flag, type, range, help per config dataclass field; the default
is the field's), so it means the same thing in every command; docs/reference/cli.md's "Command-line
vocabulary" table lists them. Where a meaning differs, the name differs too (an experiment's
``--rows-per-forward`` is not a finetune's ``--batch-size``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from graft.errors import GraftError, RemoteError
from graft.results import TRACKERS

if TYPE_CHECKING:  # the designs load torch: only when a command runs
    from graft.study import Design, DesignRun, RunSpecs
from graft.study import VARIANTS, ExperimentConfig
from graft_experiments.click_types import item_list
from graft_experiments.command import LoggingCommand, OneLineError, flag_of, in_user_words
from graft_experiments.options import (
    CLI_ONLY,
    REMOTE_FLAGS,
    RemoteConfig,
    cli_only_option,
    field_option,
)

VARIANT_HELP = (
    "one (trained on one direction), both (also the swapped renderings), task (= one-A: "
    "fact set A of a split dataset), relation (= one-B), one-A, one-B, both-A, both-B."
)

# Help sections, in print order after the command's own options ("Options").
MODEL_DATA = "Model and data"
RUN = "Run"
REPLICATES = "Replicates (one set of donors per seed)"
DONORS = "Donor finetuning (when a donor is missing from the workspace)"
OUTPUT = "Output"
REMOTE = "Remote execution (only with --remote)"
SECTIONS = (MODEL_DATA, REPLICATES, RUN, DONORS, OUTPUT, REMOTE)
#: The remote options' parameters: RemoteConfig's fields, in help order.
REMOTE_PARAMS = tuple(REMOTE_FLAGS)
#: The shared options of every experiment command by help section, in help order:
#: ExperimentConfig's fields with a flag, --dry-run and --quiet.
SHARED = {
    MODEL_DATA: ("model", "dataset", "n_facts", "data_seed", "shuffle", "templates", "n"),
    REPLICATES: ("data_seeds", "finetune_seeds", "control"),
    RUN: (
        "batch_size",
        "device",
        "dtype",
        "seed",
        "n_boot",
        "head_policy",
        "protocol",
        "score_full_name",
        "skip_memory_check",
        "dry_run",
    ),
    DONORS: ("preset", "finetune_max_steps", "generic_corpus", "allow_weak_donor"),
    OUTPUT: ("out", "workspace", "overwrite", "quiet"),
}
SHARED_NAMES = tuple(name for names in SHARED.values() for name in names)
SECTION_OF: dict[str, str] = {
    **{name: section for section, names in SHARED.items() for name in names},
    "report_to": OUTPUT,
    "variant": MODEL_DATA,
    **dict.fromkeys(REMOTE_PARAMS, REMOTE),
}


class GraftCommand(LoggingCommand):
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


def experiment_command(short_help: str) -> Callable[[Callable], click.Command]:
    """``click.command`` of an experiment: a :class:`GraftCommand` listed as ``short_help``."""
    return click.command(cls=GraftCommand, short_help=short_help)


# ------------------------------------------------------------- options of several commands


def model_option() -> Callable:
    return field_option(ExperimentConfig, "model")


def quiet_option() -> Callable:
    return cli_only_option("quiet")


def variant_option(what: str = "the donor", default: str | None = None) -> Callable:
    """``--variant``: the finetune data variant of ``what`` (default None: the protocol's)."""
    shown = f"[default: {default}]" if default else "[default: one; both under --protocol paper]"
    return click.option(
        "--variant",
        type=click.Choice(VARIANTS),
        default=default,
        help=f"Finetune data variant of {what}: {VARIANT_HELP} {shown}",
    )


def list_option(flag: str, default: tuple[str, ...], help: str, name: str = "") -> Callable:
    """A comma-separated list option of one command: its parameter is a list (``''``: the
    empty one); ``name`` renames the parameter."""
    name = name or flag[2:].replace("-", "_")
    return click.option(
        flag, name, callback=item_list, default=",".join(default), show_default=True, help=help
    )


def apply_options(func: Callable, options: list[Callable]) -> Callable:
    """Decorate ``func`` so that ``options`` appear in ``--help`` in list order."""
    for option in reversed(options):
        func = option(func)
    return func


def with_options(options: list[Callable]) -> Callable[[Callable], Callable]:
    """Decorator form of :func:`apply_options`."""
    return lambda func: apply_options(func, options)


def given(name: str) -> bool:
    """Whether the current command's option ``name`` was given (not its default)."""
    source = click.get_current_context().get_parameter_source(name)
    return source not in (None, ParameterSource.DEFAULT)


def check_dataset_options(dataset: str) -> None:
    """``--n-facts``, ``--data-seed``, ``--data-seeds`` and ``--shuffle`` describe a generated
    dataset, not a folder (so do control models); ``--data-seeds`` replaces ``--data-seed``."""
    if given("data_seed") and given("data_seeds"):
        raise click.UsageError("--data-seed and --data-seeds both given: give one")
    if not Path(dataset).is_dir():
        return
    if given("n_facts") or given("data_seed"):
        raise click.UsageError(
            f"--n-facts and --data-seed describe a generated dataset; {dataset} is a dataset "
            "folder: drop them (or pass a data kind to --dataset)"
        )
    if given("data_seeds") or given("control"):
        raise click.UsageError(
            f"--data-seeds and --control generate datasets of other data seeds; {dataset} is "
            "a dataset folder: drop them (or pass a data kind to --dataset)"
        )
    if given("shuffle"):
        raise click.UsageError(
            f"--shuffle describes a generated real_movies_shuffled; {dataset} is a dataset "
            "folder, which keeps the shuffle it was made with: drop it"
        )


# ------------------------------------------------------------------------ remote options


def remote_config(values: dict) -> RemoteConfig | None:
    """The :class:`RemoteConfig` of the remote options' ``values`` (field name -> value), or
    None for a local run. Any remote option without ``--remote`` is a usage error (exit 2),
    never silently ignored; a bad combination is a ``click.BadParameter``."""
    try:
        config = RemoteConfig(**values)
    except RemoteError as err:
        raise click.BadParameter(in_user_words(err), param_hint=flag_of(err)) from None
    if config.mode != "local":
        return config
    ctx = click.get_current_context()
    flags = [p.opts[0] for p in ctx.command.params if p.name in values and given(p.name)]
    if flags:
        one = len(flags) == 1
        raise click.UsageError(
            f"{', '.join(flags)} {'applies' if one else 'apply'} only to remote runs: "
            f"add --remote (or drop {'it' if one else 'them'})"
        )
    return None


def remote_options(func: Callable) -> Callable:
    """Click decorator: add the remote-execution options (:data:`REMOTE_FLAGS`: ``--remote``,
    ``--ndif-host``, ``--ndif-model-key``, ``--donor-mode``, ``--hosted-donor``,
    ``--max-payload-mb``, ``--remote-timeout``, ``--remote-retries``); the command gets one
    keyword argument ``remote``: a :class:`RemoteConfig`, or None without ``--remote``."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        values = {name: kwargs.pop(name) for name in REMOTE_PARAMS}
        return func(*args, remote=remote_config(values), **kwargs)

    return apply_options(wrapper, [field_option(RemoteConfig, n) for n in REMOTE_PARAMS])


# ------------------------------------------------------------------- experiment commands


#: Where :func:`shared_options` keeps ``--report-to`` for :func:`run_or_plan`.
REPORT_TO = "graft.report_to"


def _tracker_installed(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """``--report-to``'s callback: a tracker whose package is missing is refused at once, in
    one line naming the extra to install (exit 2)."""
    if value == "none":
        return value
    from graft.results import missing_package

    problem = missing_package(value)
    if problem:
        raise OneLineError(problem, 2)
    return value


def report_to_option() -> Callable:
    return click.option(
        "--report-to",
        type=click.Choice(TRACKERS),  # graft.results.tracking's: it imports nothing heavy
        default="none",
        show_default=True,
        callback=_tracker_installed,
        help="Also report the donor finetunes' losses and the run's summary metrics and "
        "figures to TensorBoard or Weights & Biases (offline without a network or API key), "
        "under <run folder>/tracking; needs pip install 'graft-interp[tracking]'.",
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
        meta = click.get_current_context().meta
        meta[DRY_RUN] = opts.pop("dry_run")
        meta[REPORT_TO] = kwargs.pop("report_to")
        return with_remote(*args, cfg_options=opts, **kwargs)

    options = [
        cli_only_option(n) if n in CLI_ONLY else field_option(ExperimentConfig, n)
        for n in SHARED_NAMES
    ]
    return apply_options(wrapper, [*options, report_to_option()])


def make_config(experiment: str, cfg_options: dict, remote, **extra) -> RunSpecs:
    """The command's options as an :class:`ExperimentConfig`, resolved once into its
    :class:`~graft.study.specs.run.RunSpecs` (a bad option: one line, exit 2, as every
    :class:`~graft.errors.GraftError` a command lets escape)."""
    from graft.study import resolve

    return resolve(ExperimentConfig(experiment=experiment, remote=remote, **cfg_options, **extra))


#: Where :func:`shared_options` keeps ``--dry-run`` for :func:`run_or_plan` (click's
#: context ``meta``).
DRY_RUN = "graft.dry_run"


def dry_run() -> bool:
    """Whether the running command was given ``--dry-run``."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.meta.get(DRY_RUN))


def echo_plan(lines: list[str]) -> None:
    """Print a plan's lines, each parameter name written as this command's flag."""
    for line in lines:
        click.echo(in_user_words(GraftError(line)))


def run_or_plan(design: Design) -> DesignRun | None:
    """Run ``design`` (:func:`graft.study.designs.design.run_design`), saying everything on
    stdout, reporting to ``--report-to``'s tracker; under ``--dry-run`` print the plan of
    each of its runs instead (nothing loaded or written) and return None. A graft error
    escapes as one line (the command class, :func:`graft_experiments.command.cli_error`)."""
    from graft.study import plan_design, run_design

    if not dry_run():
        ctx = click.get_current_context(silent=True)
        tracker = ctx.meta.get(REPORT_TO, "none") if ctx is not None else "none"
        return run_design(design, echo=click.echo, report_to=tracker)
    for note in design.notes:
        click.echo(f"note: {note}")
    for plan in plan_design(design).values():
        echo_plan(plan.lines())
    return None


@contextlib.contextmanager
def finetune_reporting(tracker: str, workspace: str | None) -> Iterator[None]:
    """``graft-exp finetune --report-to tracker``: the Trainer's losses reported while
    inside, under ``<workspace>/tracking`` (a donor folder holds only the model's files)."""
    if tracker == "none":
        yield
        return
    from graft.results import close, reporting, tracking_for
    from graft.study import Workspace

    tracking = tracking_for(tracker, Workspace.at(workspace).root / "tracking", "finetune")
    try:
        with reporting(tracking):
            yield
    finally:
        close(tracking)
    click.echo(f"tracking: {tracking.folder} ({tracker})")


def standalone(command: click.Command) -> None:
    """Run ``command`` as its own program (``python experiments/<file>.py``)."""
    command(max_content_width=100)
