"""File-name slugs: the one place graft turns free text into a safe folder or file name."""

from __future__ import annotations

_KEPT = "._-"


def slug(text: str) -> str:
    """``text`` with every character other than letters, digits, ``.``, ``_`` and ``-``
    replaced by ``-``, stripped of leading/trailing ``-`` and ``.``; ``"x"`` when nothing is
    left. E.g. ``slug("org/model v2") == "org-model-v2"``."""
    return "".join(c if c.isalnum() or c in _KEPT else "-" for c in text).strip("-.") or "x"
