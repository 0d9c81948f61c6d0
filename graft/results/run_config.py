"""A run folder's ``config.json``: reading it back, the run key (a hash of its key fields)
that every table of the run records, and the key fields in which a new config differs from
the stored one (what a resume refuses)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from graft.errors import DamagedFileError, first_line
from graft.storage.failures import reading

CONFIG_FILE = "config.json"
# Fields that describe the environment of one invocation, not what was computed: ignored
# by the resume check when the caller gives no explicit key.
VOLATILE_FIELDS = frozenset(
    {"created", "packages", "git_commit", "git_dirty", "machine", "command", "resumes", "run_key"}
)
#: The fix a damaged config's message names.
CONFIG_FIX = "rerun with --overwrite to start the run anew, or choose a new --out folder"


_MISSING = "<missing>"


def _lookup(config: Mapping[str, Any], dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _text(value: Any) -> str:
    return json.dumps(value) if value is not _MISSING else _MISSING


def config_key(config: Mapping[str, Any], key: Sequence[str] | None = None) -> str:
    """The run key: a hash of ``config``'s ``key`` fields (default: every field but the
    volatile ones), what :meth:`graft.results.folder.RunFolder.check_config` compares. Two
    configs that resume each other have the same run key."""
    fields = sorted(set(key) if key is not None else set(config) - VOLATILE_FIELDS)
    text = json.dumps({f: _text(_lookup(config, f)) for f in fields}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def options_digest(config: Mapping[str, Any]) -> str:
    """The digest of ``config``'s ``options`` (what shapes a run's derived tables: n_boot,
    seed, ...), recorded in each derived table's marks; ``""`` when it records none."""
    options = config.get("options")
    if not isinstance(options, Mapping):
        return ""
    text = json.dumps(options, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def recorded_options(folder: str | os.PathLike[str]) -> str:
    """The :func:`options_digest` of ``folder``'s ``config.json`` (``""`` when none)."""
    config_file = Path(folder) / CONFIG_FILE
    return options_digest(read_config_file(config_file) if config_file.is_file() else {})


def recorded_run_key(folder: str | os.PathLike[str]) -> str:
    """The run key ``folder``'s ``config.json`` records (``""`` when none does)."""
    config_file = Path(folder) / CONFIG_FILE
    config = read_config_file(config_file) if config_file.is_file() else {}
    return str(config.get("run_key") or "")


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A run's ``config.json`` as a dict.

    Raises:
        DamagedFileError: the file is not a JSON object.
    """
    path = Path(path)
    try:
        with reading("the run config", path):
            text = path.read_text(encoding="utf-8")
        config = json.loads(text)
    except (OSError, ValueError) as err:
        raise DamagedFileError(
            f"{path} is not a readable JSON run config ({first_line(err, 200)}); "
            f"graft-exp repair {path.parent} restores the folder's own copy; else {CONFIG_FIX}"
        ) from None
    if not isinstance(config, dict):
        raise DamagedFileError(
            f"{path} is not a JSON object (a {type(config).__name__}); graft-exp repair "
            f"{path.parent} restores the folder's own copy; else {CONFIG_FIX}"
        )
    return config


def config_changes(
    old: Mapping[str, Any], new: Mapping[str, Any], key: Sequence[str] | None = None
) -> str:
    """The ``key`` fields (default: every field of either but the volatile ones) in which
    ``new`` differs from the stored ``old``, in words, old and new value; ``""`` when none."""
    fields = list(key) if key is not None else sorted((set(old) | set(new)) - VOLATILE_FIELDS)
    differ = [f for f in fields if _lookup(old, f) != _lookup(new, f)]
    return "; ".join(
        f"{f} stored {_text(_lookup(old, f))}, now {_text(_lookup(new, f))}" for f in differ
    )
