"""The one exception base of graft: every error a user can fix by changing their input.

Library code raises a subclass of :class:`GraftError` whose message names the problem and the
fix in one line; the command line turns any ``GraftError`` into that line and exit code 2.
Anything else that escapes is a bug in graft.
"""

from __future__ import annotations


def first_line(err: BaseException, limit: int | None = None) -> str:
    """The first line of ``err``'s text (its type's name when it has none), cut to ``limit``
    characters: what a one-line message quotes of a library's error."""
    lines = str(err).strip().splitlines()
    return (lines[0] if lines else type(err).__name__)[:limit]


class GraftError(ValueError):
    """Bad input; ``str(err)`` is one line naming the problem and the fix.

    ``param`` (when set) names the parameter to fix as the library calls it (e.g.
    ``"n_facts"``); the command line writes it, in the message too, as the flag the user
    typed (``--n-facts``).
    """

    def __init__(self, *args: object, param: str | None = None) -> None:
        super().__init__(*args)
        self.param = param


class UnsupportedModelError(GraftError):
    """A model of an architecture family graft has no table for."""


class SpecError(GraftError):
    """A graft spec (or its use on a model or prompt) is invalid; the message names the part."""


class ConfigMismatchError(GraftError):
    """The run folder holds results of a different configuration."""


class ExperimentError(GraftError):
    """Bad experiment input; the message names the problem and the fix."""


class DatasetError(GraftError):
    """Bad dataset input; ``param`` names the option to fix (e.g. ``"n_facts"``)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message, param=param)


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


class ModelNotFoundError(GraftError):
    """Raised for a name that is neither a registry name, a local directory nor a hub id."""


class FinetuneError(GraftError):
    """Bad finetuning input (dataset, config, output folder); the message says what to fix."""


class StatsError(GraftError):
    """Bad input to a statistics function (counts, levels, arrays, table columns)."""


class DeviceError(GraftError):
    """A device string torch does not know, or a device this machine does not have."""


class RunFolderError(GraftError):
    """The output folder cannot be written, or is not a run folder graft wrote."""


class SpanError(GraftError):
    """A field's character span does not fit its text."""


class ResultsError(GraftError):
    """Bad input to a metric, summary, results table or figure (a missing column, logits of
    the wrong shape, an unknown metric name); the message says what to pass instead."""


class StorageError(GraftError):
    """A file could not be written (disk full, read-only, no permission); the message names the
    path and says that the rerun after freeing space resumes where this one stopped."""


class DamagedFileError(GraftError):
    """A file graft wrote and now reads back is damaged, truncated, edited or another run's:
    its checksum, key or format does not match what was recorded; the message names the file
    and how to rebuild it."""


class MemoryPlanError(GraftError):
    """A run whose memory plan does not fit the device's free memory, refused before anything
    is loaded; the message gives the need, what is free, the setting that makes it fit and
    the override."""


class SlowPathWarning(UserWarning):
    """graft fell back to a slower way of computing the same numbers (a shortcut that the
    installed libraries do not support); the message names the cause and the cost."""
