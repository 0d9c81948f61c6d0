"""The command-line vocabulary of ``graft-exp``, and the glue from options to graft.study.running.runner.

Every option that more than one command takes is built from one table,
:mod:`experiments.options` (flag, type, range, help per config dataclass field; the default
is the field's), so it means the same thing in every command; the README's "Command-line
vocabulary" table lists them. Where a meaning differs, the name differs too (an experiment's
``--rows-per-forward`` is not a finetune's ``--batch-size``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import click
from click.core import ParameterSource

from experiments.options import (
    CLI_ONLY,
    FLAGS,
    REMOTE_FLAGS,
    RemoteConfig,
    cli_only_option,
    field_option,
)
from graft.errors import GraftError, RemoteError
from graft.study.planning.run_plan import plan_experiment
from graft.study.running.runner import (
    ExperimentConfig,
    ExperimentRun,
    print_summary,
    run_experiment,
)
from graft.study.specs.grafts import Graft
from graft.study.specs.templates import DIRECTIONS
from graft.study.training.workspace import VARIANT_ALIASES

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
#: The shared options of every experiment command, in help order: ExperimentConfig's fields
#: with a flag, and --quiet.
SHARED_NAMES = (
    "model",
    "dataset",
    "n_facts",
    "data_seed",
    "shuffle",
    "data_seeds",
    "finetune_seeds",
    "control",
    "templates",
    "n",
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
    "preset",
    "finetune_max_steps",
    "generic_corpus",
    "out",
    "workspace",
    "overwrite",
    "quiet",
)
SECTION_OF: dict[str, str] = {
    **dict.fromkeys(
        ("model", "dataset", "n_facts", "data_seed", "shuffle", "templates", "n", "variant"),
        MODEL_DATA,
    ),
    **dict.fromkeys(("data_seeds", "finetune_seeds", "control"), REPLICATES),
    **dict.fromkeys(
        (
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
        RUN,
    ),
    **dict.fromkeys(("preset", "finetune_max_steps", "generic_corpus"), DONORS),
    **dict.fromkeys(("out", "workspace", "overwrite", "quiet"), OUTPUT),
    **dict.fromkeys(REMOTE_PARAMS, REMOTE),
}


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (click's test runner swaps it)."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ sets it
        pass


@contextlib.contextmanager
def cli_logging(quiet: bool = False) -> Iterator[None]:
    """While a command runs, library messages (the ``graft`` loggers) go to stderr, one line
    each; ``quiet`` keeps warnings only and also hides transformers' own progress bars.
    The logger is restored afterwards (commands may run inside a notebook or a test)."""
    logger = logging.getLogger("graft")
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING if quiet else logging.INFO)
    if quiet:
        silence_library_progress()
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


# ------------------------------------------------------- library errors in the user's words

#: Library parameter names that are no config field, and the flag that gives them.
LIBRARY_FLAGS = {"donors": "--donor", "facts_path": "--facts", "max_steps": "--finetune-max-steps"}


def _flags(command: click.Command | None) -> dict[str, str]:
    """Library parameter name -> the flag ``command`` takes for it: the command's own
    options first, then the config fields' flags (:data:`~experiments.options.FLAGS`) and
    :data:`LIBRARY_FLAGS`, where the command has that flag."""
    own = {
        p.name: p.opts[0]
        for p in (command.params if command else [])
        if isinstance(p, click.Option) and p.name and p.opts[0].startswith("--")
    }
    fields = {n: f.decl.split("/")[0] for table in FLAGS.values() for n, f in table.items()}
    known = set(own.values())
    return {
        **{n: flag for n, flag in {**fields, **LIBRARY_FLAGS}.items() if flag in known},
        **own,
    }


def in_user_words(err: GraftError, command: click.Command | None = None) -> str:
    """The message of ``err`` with each library parameter name written as the flag the user
    types on ``command`` (default: the running command): ``max_payload_mb`` ->
    ``--max-payload-mb``, ``donor_mode='hosted'`` -> ``--donor-mode hosted``.

    Names with an underscore are rewritten wherever they stand alone; a plain word
    (``templates``, ``host``) only when it is the error's ``param``, and only where it first
    stands, so the prose stays ("dataset 'x' is neither a dataset folder ...")."""
    if command is None:
        ctx = click.get_current_context(silent=True)
        command = ctx.command if ctx else None
    flags = _flags(command)
    message = str(err)
    for name in sorted(flags, key=len, reverse=True):
        if "_" in name or name == err.param:
            pattern = rf"(?<![\w./-]){re.escape(name)}(?:='([^']*)'|=(\w+))?(?![\w/-])"
            count = 0 if "_" in name else 1
            message = re.sub(pattern, _written_as(flags[name]), message, count=count)
    return message


def _written_as(flag: str) -> Callable[[re.Match[str]], str]:
    """A :func:`re.sub` replacement: ``flag``, then the value the match assigned, if any."""
    return lambda match: " ".join([flag, *(v for v in match.groups() if v is not None)])


def flag_of(err: GraftError) -> str | None:
    """The flag of the running command that ``err``'s parameter is given by, or None."""
    ctx = click.get_current_context(silent=True)
    return _flags(ctx.command if ctx else None).get(err.param or "")


def cli_error(err: GraftError) -> click.ClickException:
    """The command line's form of ``err``: its message in the user's words; a remote server
    (or the way to it) failing exits 1, any other bad input is a usage error (exit 2)."""
    message = in_user_words(err)
    if isinstance(err, RemoteError) and err.kind != "config":
        return click.ClickException(message)
    return click.UsageError(message, click.get_current_context(silent=True))


class LoggingCommand(click.Command):
    """A command that runs under :func:`cli_logging` (``--quiet`` when it has one); a
    :class:`~graft.errors.GraftError` that escapes it becomes :func:`cli_error`'s line."""

    def invoke(self, ctx: click.Context):
        with cli_logging(bool(ctx.params.get("quiet"))):
            try:
                return super().invoke(ctx)
            except GraftError as err:
                raise cli_error(err) from None


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


def silence_library_progress() -> None:
    """``--quiet``: also hide transformers' own bars (weight loading, checkpoint writing)."""
    import transformers

    transformers.utils.logging.disable_progress_bar()


# ------------------------------------------------------------- options of several commands


def model_option() -> Callable:
    return field_option(ExperimentConfig, "model")


def quiet_option() -> Callable:
    return cli_only_option("quiet")


def variant_option(default: str = "one", what: str = "the donor") -> Callable:
    """``--variant``: the finetune data variant of ``what``."""
    return click.option(
        "--variant",
        type=click.Choice(VARIANTS),
        default=default,
        show_default=True,
        help=f"Finetune data variant of {what}: {VARIANT_HELP}",
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
        click.get_current_context().meta[DRY_RUN] = opts.pop("dry_run")
        return with_remote(*args, cfg_options=opts, **kwargs)

    options = [
        cli_only_option(n) if n in CLI_ONLY else field_option(ExperimentConfig, n)
        for n in SHARED_NAMES
    ]
    return apply_options(wrapper, options)


def make_config(experiment: str, cfg_options: dict, remote, **extra) -> ExperimentConfig:
    """The command's :class:`ExperimentConfig`."""
    return ExperimentConfig(experiment=experiment, remote=remote, **cfg_options, **extra)


def echo_protocol_notes(notes: list[str]) -> dict[str, list[str]]:
    """Print each line of ``notes`` (what of the paper's protocol a run does not reproduce,
    :func:`graft.study.specs.grafts.protocol_notes`) and return them as ``config.json`` entries
    (none when there are none)."""
    for note in notes:
        click.echo(f"note: {note}")
    return {"protocol_notes": notes} if notes else {}


def protocol_default(param: str, value, paper_value, protocol: str):
    """The command's option ``param``: ``value`` as given or defaulted, but ``paper_value``
    under ``--protocol paper`` when ``param`` was not given (e.g. the both-direction donor)."""
    return paper_value if protocol == "paper" and not given(param) else value


#: Where :func:`shared_options` keeps ``--dry-run`` for :func:`run_or_plan` (click's
#: context ``meta``).
DRY_RUN = "graft.dry_run"


def echo_plan(lines: list[str]) -> None:
    """Print a plan's lines, each parameter name written as this command's flag."""
    for line in lines:
        click.echo(in_user_words(GraftError(line)))


def run_or_plan(cfg: ExperimentConfig, grafts: list[Graft], **options) -> ExperimentRun | None:
    """:func:`run_and_report` of ``run_experiment(cfg, grafts, **options)``; under
    ``--dry-run`` its plan instead (:func:`graft.study.planning.run_plan.plan_experiment`: nothing
    loaded or written), and None."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.meta.get(DRY_RUN):
        try:
            plan = plan_experiment(cfg, grafts, **options)
        except GraftError as err:
            raise cli_error(err) from None
        echo_plan(plan.lines())
        return None
    return run_and_report(lambda: run_experiment(cfg, grafts, **options))


def run_and_report(fn: Callable[[], ExperimentRun], metric: str = "acc@5") -> ExperimentRun:
    """Run an experiment and print its summary; bad input becomes one line (:func:`cli_error`:
    exit 2, or 1 when a remote server failed)."""
    try:
        run = fn()
    except GraftError as err:
        raise cli_error(err) from None
    print_summary(run.summary, metric, echo=click.echo)
    click.echo(f"results: {run.folder.path}")
    click.echo(run.times.line())
    return run


def echo_figures(run_folder: str | Path) -> None:
    """Draw the figures of ``run_folder``, name each PNG and say how long drawing took."""
    from graft.results.report import draw_figures

    start = time.perf_counter()
    for png in draw_figures(run_folder):
        click.echo(f"figure: {png}")
    click.echo(f"time: figures {time.perf_counter() - start:.1f} s")


def standalone(command: click.Command) -> None:
    """Run ``command`` as its own program (``python experiments/<file>.py``)."""
    command(max_content_width=100)
