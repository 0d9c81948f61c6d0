"""graft's errors: one base, four kinds a caller can catch, each message one line.

Library code raises a subclass of :class:`GraftError` whose ``str()`` names the problem and
the fix in one line. ``GraftError`` is an ``Exception`` of its own (not a ``ValueError``):
a full disk or a server timeout is no bad value. Anything else that escapes is a bug in
graft (or an error of Python, torch or a library graft passes on unchanged). The tree::

    GraftError                 graft's base: except GraftError catches every kind below
    ├── InputError             the user's input is wrong: a spec, option, dataset or model named
    │   ├── SpecError          a graft spec (or its use on a model or prompt) is invalid
    │   ├── TraceError         a grafted trace used after its block, or asked what it was not opened for
    │   ├── ExperimentError    bad experiment input (options, seeds, grafts of one name)
    │   ├── DatasetError       bad dataset input (files, options, generated data)
    │   ├── FinetuneError      bad finetuning input (dataset, config, output folder)
    │   ├── UnsupportedModelError  a model of an architecture family graft has no table for
    │   ├── ModelNotFoundError     a model name that is no registry name, folder or hub id
    │   ├── DeviceError        a device torch does not know, or this machine does not have
    │   ├── ConfigMismatchError    a run folder holds results of another configuration
    │   ├── MemoryPlanError    a run or finetune that does not fit the device's free memory
    │   ├── SpanError          a field's character span does not fit its text
    │   ├── StatsError         bad input to a statistics function
    │   └── ResultsError       bad input to a metric, summary, results table or figure
    ├── StorageError           files on disk: one cannot be written (disk full, read-only)
    │   ├── DamagedFileError   a file graft wrote reads back damaged, edited or another run's
    │   ├── RunFolderError     a folder that cannot be written or is no (finished) run folder
    │   └── LockError          a cross-process lock stopped this process (exit 3)
    │       ├── LockTimeoutError   another job held a lock longer than GRAFT_LOCK_TIMEOUT
    │       └── LockLostError      a lease lock was taken over while this process was paused
    ├── RemoteError            a remote run failed; ``kind`` says how (``config``: a bad setting)
    └── UpstreamError          a library or service graft depends on failed in a way graft detects
        └── HubUnavailable     the paper's generic corpus could not be read from the hub

The command line (``graft_experiments.command.cli_error``) prints every one as one line: an
:class:`InputError` (and a :class:`RemoteError` of kind ``config``) as a usage error, exit 2;
a :class:`StorageError` with exit 2 and no usage text (a :class:`LockError`: exit 3); a :class:`RemoteError` of any other
kind and an :class:`UpstreamError` with exit 1 (docs/reference/errors.md).
"""

from __future__ import annotations


def first_line(err: BaseException, limit: int | None = None) -> str:
    """The first line of ``err``'s text (its type's name when it has none), cut to ``limit``
    characters: what a one-line message quotes of a library's error."""
    lines = str(err).strip().splitlines()
    return (lines[0] if lines else type(err).__name__)[:limit]


class GraftError(Exception):
    """graft's base error; ``str(err)`` is one line naming the problem and the fix.

    ``param`` (when set) names the parameter to fix as the library calls it (e.g.
    ``"n_facts"``); the command line writes it, in the message too, as the flag the user
    typed (``--n-facts``). ``params`` names other parameters the message names as plain
    words (``drop texts and targets``): the command line writes each as its flag wherever
    it stands (``drop --text and --target``).
    """

    def __init__(
        self, *args: object, param: str | None = None, params: tuple[str, ...] = ()
    ) -> None:
        super().__init__(*args)
        self.param = param
        self.params = params


# --------------------------------------------------------------------------- user input


class InputError(GraftError):
    """The user's input is wrong (a spec, an option, a dataset, a model they named): changing
    it fixes the error. The command line exits 2 ("fix the command line")."""


class UnsupportedModelError(InputError):
    """A model of an architecture family graft has no table for."""


class SpecError(InputError):
    """A graft spec (or its use on a model or prompt) is invalid; the message names the part."""


class TraceError(InputError):
    """A grafted trace is used outside its life (after its block, entered twice) or asked for
    what it was not opened for (attention probabilities without ``attention=True``)."""


class ConfigMismatchError(InputError):
    """The run folder holds results of a different configuration (a new ``--out`` or
    ``--overwrite`` fixes it: the request, not the folder, is what differs)."""


class ExperimentError(InputError):
    """Bad experiment input; the message names the problem and the fix."""


class DatasetError(InputError):
    """Bad dataset input; ``param`` names the option to fix (e.g. ``"n_facts"``)."""

    def __init__(
        self, message: str, param: str | None = None, params: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message, param=param, params=params)


class ModelNotFoundError(InputError):
    """Raised for a name that is neither a registry name, a local directory nor a hub id."""


class FinetuneError(InputError):
    """Bad finetuning input (dataset, config, output folder); the message says what to fix."""


class StatsError(InputError):
    """Bad input to a statistics function (counts, levels, arrays, table columns)."""


class DeviceError(InputError):
    """A device string torch does not know, or a device this machine does not have."""


class SpanError(InputError):
    """A field's character span does not fit its text."""


class ResultsError(InputError):
    """Bad input to a metric, summary, results table or figure (a missing column, logits of
    the wrong shape, an unknown metric name); the message says what to pass instead."""


class MemoryPlanError(InputError):
    """A run whose memory plan does not fit the device's free memory, refused before anything
    is loaded; the message gives the need, what is free, the setting that makes it fit and
    the override."""


# ------------------------------------------------------------------------------ storage


class StorageError(GraftError):
    """Files on disk. Raised as itself: a file could not be written (disk full, read-only, no
    permission); the message names the path and the fix, then says to rerun (and that the
    rerun resumes where this one stopped, for a run or a finetune only). Its subclasses: a
    file read back damaged (:class:`DamagedFileError`), a folder that is no run folder
    (:class:`RunFolderError`)."""


class DamagedFileError(StorageError):
    """A file graft wrote and now reads back is damaged, truncated, edited or another run's:
    its checksum, key or format does not match what was recorded; the message names the file
    and how to rebuild it."""


class LockError(StorageError):
    """A cross-process lock (graft.storage.locks) stopped this process: the command line
    exits 3 (rerun later, or stop the other job)."""


class LockTimeoutError(LockError):
    """Another process held a lock longer than ``GRAFT_LOCK_TIMEOUT`` (graft.storage.locks)."""


class LockLostError(LockError):
    """A lease lock this process held was taken over by another process while this one was
    paused past its lease (``GRAFT_LOCK_MODE=lease``); it stopped before writing more."""


class RunFolderError(StorageError):
    """The output folder cannot be written, or is not a (finished) run folder graft wrote."""


# ------------------------------------------------------------------------------- remote


class RemoteError(GraftError):
    """A remote run failed; ``str(err)`` is one line saying what happened and what to do.

    Args:
        message: the one-line message.
        kind: ``unreachable`` | ``protocol`` | ``auth`` | ``model`` | ``payload`` |
            ``server`` | ``timeout`` | ``transient`` | ``config``. Every kind but ``config``
            (a bad setting, refused before any request) is the server or the way to it
            failing: the command line exits 1 for those, 2 for ``config``.
        detail: the server's full text where there is one (e.g. its traceback).
        param: the setting to fix, where there is one (e.g. ``"host"``).
    """

    def __init__(
        self,
        message: str,
        *,
        kind: str = "server",
        detail: str | None = None,
        param: str | None = None,
    ):
        super().__init__(message, param=param)
        self.kind = kind
        self.detail = detail


# ----------------------------------------------------------------------------- upstream


class UpstreamError(GraftError):
    """A library or service graft depends on (the Hugging Face hub, ``datasets``,
    transformers, nnsight) failed, is missing or changed in a way graft detects; the message
    names it and what to do. The command line exits 1: the user's input was not the cause."""


class HubUnavailable(UpstreamError):
    """The paper's corpus could not be read from the hub; the message says why."""


# ------------------------------------------------------------------------------ warnings


class SlowPathWarning(UserWarning):
    """graft fell back to a slower way of computing the same numbers (a shortcut that the
    installed libraries do not support); the message names the cause and the cost."""
