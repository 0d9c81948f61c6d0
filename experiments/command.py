"""How a ``graft-exp`` command talks to its user: library messages on stderr one line each
(:func:`graft.results.run_log.console_logging`; ``--quiet`` keeps warnings), a :class:`~graft.errors.GraftError` said in the command line's
words (the flag that fixes it) with the exit code of its kind, and the command class that
does both."""

from __future__ import annotations

import re
from collections.abc import Callable

import click

from graft.errors import GraftError, LockError, RemoteError, StorageError, UpstreamError
from graft_experiments.options import FLAGS

# ------------------------------------------------------- library errors in the user's words

#: Library parameter names that are no config field, and the flag that gives them.
LIBRARY_FLAGS = {
    "donors": "--donor",
    "facts_path": "--facts",
    "max_steps": "--finetune-max-steps",
    "graft_specs": "--spec",
    "base": "--base",
}


def _flags(command: click.Command | None) -> dict[str, str]:
    """Library parameter name -> the flag ``command`` takes for it: the command's own
    options first, then the config fields' flags (:data:`~graft_experiments.options.FLAGS`) and
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

    Names with an underscore, and the plain words the error's ``params`` lists, are
    rewritten wherever they stand alone; a plain word (``templates``, ``host``) that is the
    error's ``param`` only where it first stands, so the prose stays ("dataset 'x' is neither
    a dataset folder ..."). A name after a dot or a double quote (a stored config's key:
    ``options.n``, ``{"multi_cell": true}``) stays."""
    if command is None:
        ctx = click.get_current_context(silent=True)
        command = ctx.command if ctx else None
    flags = _flags(command)
    message = str(err)
    for name in sorted(flags, key=len, reverse=True):
        everywhere = "_" in name or name in err.params
        if everywhere or name == err.param:
            pattern = rf"(?<![\w./\"-]){re.escape(name)}(?:='([^']*)'|=(\w+))?(?![\w/-])"
            count = 0 if everywhere else 1
            message = re.sub(pattern, _written_as(flags[name]), message, count=count)
    return message


def _written_as(flag: str) -> Callable[[re.Match[str]], str]:
    """A :func:`re.sub` replacement: ``flag``, then the value the match assigned, if any."""
    return lambda match: " ".join([flag, *(v for v in match.groups() if v is not None)])


def flag_of(err: GraftError) -> str | None:
    """The flag of the running command that ``err``'s parameter is given by, or None."""
    ctx = click.get_current_context(silent=True)
    return _flags(ctx.command if ctx else None).get(err.param or "")


class OneLineError(click.ClickException):
    """An error the command line prints as ``Error: <message>`` alone (no usage text above
    it, as a :class:`click.UsageError` has), exiting with ``exit_code``."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


#: Exit code of each kind of :class:`~graft.errors.GraftError` that is no usage error
#: (docs/reference/errors.md): a storage error is fixed by the user too (free space, rebuild a file,
#: another folder), a server or a library failing is not.
EXIT_CODES: tuple[tuple[type[GraftError], int], ...] = (
    # a job waited its bound for another, or lost its lease while paused: rerun (later)
    (LockError, 3),
    (StorageError, 2),
    (RemoteError, 1),
    (UpstreamError, 1),
)


def cli_error(err: GraftError) -> click.ClickException:
    """The command line's form of ``err``: its message in the user's words. Bad input (an
    :class:`~graft.errors.InputError`, a ``RemoteError`` of kind ``config``, a ``GraftError``
    of no kind) is a usage error, exit 2; any other kind one line without usage text:
    storage exit 2, a remote server (or the way to it) or a library failing exit 1
    (:data:`EXIT_CODES`)."""
    message = in_user_words(err)
    if not (isinstance(err, RemoteError) and err.kind == "config"):
        for kind, code in EXIT_CODES:
            if isinstance(err, kind):
                return OneLineError(message, code)
    flag = flag_of(err)
    if flag and flag not in message:  # a bad value, said as click says one: which flag
        message = f"Invalid value for '{flag}': {message}"
    return click.UsageError(message, click.get_current_context(silent=True))


class LoggingCommand(click.Command):
    """A command that runs under :func:`graft.results.run_log.console_logging` (``--quiet``
    when it has one); a
    :class:`~graft.errors.GraftError` that escapes it becomes :func:`cli_error`'s line."""

    def invoke(self, ctx: click.Context):
        from graft.results import console_logging

        with console_logging(bool(ctx.params.get("quiet"))):
            try:
                return super().invoke(ctx)
            except GraftError as err:
                raise cli_error(err) from None
            except Exception as err:
                # a storage error no reader or writer said in its words: still one line
                from graft.storage import uncaught_storage_error

                storage = uncaught_storage_error(err)
                if storage is None:
                    raise
                raise cli_error(storage) from None
