"""The one exception base of graft: every error a user can fix by changing their input.

Library code raises a subclass of :class:`GraftError` whose message names the problem and the
fix in one line; the command line turns any ``GraftError`` into that line and exit code 2.
Anything else that escapes is a bug in graft.
"""

from __future__ import annotations


class GraftError(ValueError):
    """Bad input; ``str(err)`` is one line naming the problem and the fix."""


class UnsupportedModelError(GraftError):
    """A model of an architecture family graft has no table for."""
