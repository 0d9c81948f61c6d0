"""Resumable run folders: a resolved config plus batch-wise result tables.

Layout of a run folder::

    <out>/.graft-run               marker: graft wrote this folder (only such folders are cleared)
    <out>/config.json              resolved config (written once; checked on resume)
    <out>/parts/<name>/<batch>.parquet   one file per finished batch
    <out>/<name>.parquet           all batches combined (finalize)
    <out>/summary.parquet, .csv    the summary table
    <out>/contrasts.parquet, .csv  paired contrasts of key graft pairs (when the run has any)

Every file is written to a temp file in the same folder and moved into place with
``os.replace`` (:func:`graft.storage.files.atomic_path`), so an interrupted run loses at most
the batch in flight and never leaves a half-written table under a real name. Stray temp files
(``.*.tmp``) are ignored by readers and removed by :meth:`RunFolder.write_config` (the start
of every run), :meth:`RunFolder.finalize` and :meth:`RunFolder.clear`. A full disk (or a read-only or forbidden place) is one
:class:`~graft.errors.StorageError` line naming the file.

Every table carries in its parquet metadata (``graft.*`` keys) the run key (a hash of the
stored config's key fields), its table name, its batch id (parts), its row count and a digest
of its content (:func:`frame_digest`). On resume every part is checked (:meth:`RunFolder.
done_batches`): a damaged part, or one of another run, table or batch, is moved to
``parts/<name>/.set-aside/`` with a warning and its batch runs again. Reading a table back
(:meth:`RunFolder.read`, :func:`read_table`) checks it the same way and raises one
:class:`~graft.errors.DamagedFileError` line naming the file and the fix. Parts and tables
without ``graft.*`` metadata (written by graft versions before it) are read as they are,
unchecked, when they parse.

Nothing is written before the first :meth:`RunFolder.write_config` (constructing a
``RunFolder`` creates no folder), and a folder holding a ``config.json`` without the marker
(say, a model folder) is neither resumed nor cleared.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import polars as pl

from graft.errors import ConfigMismatchError, DamagedFileError, RunFolderError, first_line
from graft.results.provenance import (
    command_line,
    git_commit,
    git_dirty,
    machine_info,
    package_versions,
)
from graft.storage.files import (
    atomic_path,
    probe_writable,
    remove_empty,
    storage_errors,
    to_json,
    write_json_atomic,
)
from graft.storage.tables import (
    read_table,
    save_table,
    table_problem,
    write_csv,
    writing,
)

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
MARKER_FILE = ".graft-run"
PARTS_DIR = "parts"
SUMMARY_STEM = "summary"
CONTRASTS_STEM = "contrasts"
#: The key contrasts on whole-name scores (runs with ``score_full_name``).
NAME_CONTRASTS_STEM = "contrasts_name"
# Fields that describe the environment of one invocation, not what was computed: ignored
# by the resume check when the caller gives no explicit key.
VOLATILE_FIELDS = frozenset(
    {"created", "packages", "git_commit", "git_dirty", "machine", "command", "resumes", "run_key"}
)
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.=+-]*$")
#: Where a damaged or foreign part is moved (inside ``parts/<name>/``; readers skip it).
SET_ASIDE_DIR = ".set-aside"
#: The fix a damaged config's message names.
CONFIG_FIX = "rerun with --overwrite to start the run anew, or choose a new --out folder"
# the temp files of atomic_path (.<name>.<pid>.<8 hex>.tmp) and check_writable's probes
_STRAY_RE = re.compile(r"^\.(.+\.\d+\.[0-9a-f]{8}|graft-probe-.+)\.tmp$")


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


def _batch_file(batch_id: str | int) -> str:
    text = str(batch_id)
    if not text:
        raise RunFolderError("batch_id must not be empty")
    # Any batch id becomes a safe file name (graft labels hold '(', '^', ':', ...).
    encoded = quote(text, safe="-_=+,@")
    if encoded.startswith("."):
        encoded = "%2E" + encoded[1:]
    return encoded + ".parquet"


def _natural_key(text: str) -> list[tuple[int, Any]]:
    return [(0, int(t)) if t.isdigit() else (1, t) for t in re.split(r"(\d+)", text) if t]


def config_key(config: Mapping[str, Any], key: Sequence[str] | None = None) -> str:
    """The run key: a hash of ``config``'s ``key`` fields (default: every field but the
    volatile ones), what :meth:`RunFolder.check_config` compares. Two configs that resume
    each other have the same run key."""
    fields = sorted(set(key) if key is not None else set(config) - VOLATILE_FIELDS)
    text = json.dumps({f: _text(_lookup(config, f)) for f in fields}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


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
        config = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise DamagedFileError(
            f"{path} is not a readable JSON run config ({first_line(err, 200)}); {CONFIG_FIX}"
        ) from None
    if not isinstance(config, dict):
        raise DamagedFileError(
            f"{path} is not a JSON object (a {type(config).__name__}); {CONFIG_FIX}"
        )
    return config


class RunFolder:
    """A resumable output folder of one experiment run.

    Attributes:
        path: the folder (created by the first write, not on construction).
        config_path: ``path / "config.json"``.
        parts_path: ``path / "parts"``: one sub-folder of batch files per table name.
        marker_path: ``path / ".graft-run"``: written with the config; marks the folder as
            graft's, so :meth:`clear` may delete what it holds.
        run_key: the hash of the stored config's key fields (:func:`config_key`), set by
            :meth:`write_config` and recorded in ``config.json``; every table written
            records it and every part read back must record it. ``""`` before a config is
            written.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.config_path = self.path / CONFIG_FILE
        self.parts_path = self.path / PARTS_DIR
        self.marker_path = self.path / MARKER_FILE
        self.run_key = ""

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    # ------------------------------------------------------------------ checks
    def check_writable(self) -> None:
        """Raise :class:`RunFolderError` unless the folder can be created and written.

        Probes by creating the folder (and its missing parents) and a temp file in it, then
        removes all of that again: the file system is left as it was.
        """
        if self.path.exists() and not self.path.is_dir():
            raise RunFolderError(f"run folder {self.path} is a file; choose a folder path")
        try:
            remove_empty(probe_writable(self.path))
        except OSError as err:
            reason = err.strerror or type(err).__name__
            raise RunFolderError(
                f"cannot write the run folder {self.path} ({reason}); choose a writable folder"
            ) from None

    def is_marked(self) -> bool:
        """Whether graft wrote this folder: it holds the ``.graft-run`` marker, or (run
        folders of graft versions before the marker) a config.json that records an
        experiment and graft's package version."""
        if self.marker_path.is_file():
            return True
        try:
            config = json.loads(self.config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        packages = config.get("packages") if isinstance(config, dict) else None
        return "experiment" in config and isinstance(packages, dict) and "graft" in packages

    def check_owned(self) -> None:
        """Raise :class:`RunFolderError` if the folder holds files a run folder would hold
        (``config.json``, ``parts/``, ``summary.*``) but no marker: it is not graft's to
        resume or clear (a model folder, or another program's output)."""
        if self.is_marked() or not self.path.is_dir():
            return
        ours = [self.config_path, self.parts_path, *self._summary_files()]
        found = [p.name for p in ours if p.exists()]
        if found:
            raise RunFolderError(
                f"{self.path} holds {', '.join(found)} but no {MARKER_FILE} marker: it is not "
                "a run folder graft wrote, so graft will neither resume nor clear it; choose "
                "another output folder"
            )

    def mark(self) -> None:
        """Write the ``.graft-run`` marker (creates the folder)."""
        if not self.is_marked():
            marker = self.marker_path
            with writing("the run folder's marker", marker), atomic_path(marker) as tmp:
                tmp.write_text("written by graft; --overwrite may clear this folder\n")

    def _summary_files(self, stem: str = SUMMARY_STEM) -> list[Path]:
        return [self.path / f"{stem}{ext}" for ext in (".parquet", ".csv")]

    # ------------------------------------------------------------------ config
    def read_config(self) -> dict[str, Any] | None:
        """The stored config, or None when there is none yet.

        Raises:
            DamagedFileError: ``config.json`` is not a JSON object.
        """
        if not self.config_path.is_file():
            return None
        return read_config_file(self.config_path)

    def check_config(self, config: Mapping[str, Any], key: Sequence[str] | None = None) -> None:
        """Raise if :meth:`write_config` (without ``overwrite``) would refuse ``config``;
        writes nothing. See :meth:`write_config` for ``key``.

        Raises:
            RunFolderError: the folder is not graft's (see :meth:`check_owned`).
            ConfigMismatchError: a stored config differs in a ``key`` field.
        """
        self.check_owned()
        old = self.read_config()
        if old is None:
            return
        new = to_json(dict(config))
        fields = list(key) if key is not None else sorted((set(old) | set(new)) - VOLATILE_FIELDS)
        differ = [f for f in fields if _lookup(old, f) != _lookup(new, f)]
        if differ:
            changes = "; ".join(
                f"{f} stored {_text(_lookup(old, f))}, now {_text(_lookup(new, f))}" for f in differ
            )
            raise ConfigMismatchError(
                f"{self.path} holds results of a different configuration ({changes}); "
                "use a new --out folder, or --overwrite to discard the old results."
            )

    def write_config(
        self,
        config: Mapping[str, Any],
        key: Sequence[str] | None = None,
        overwrite: bool = False,
    ) -> dict[str, Any]:
        """Record the resolved config, or check it against the stored one to resume.

        ``packages`` (see :func:`package_versions`), ``git_commit``, ``git_dirty``,
        ``machine`` (:func:`machine_info`), ``command`` (the command line) and ``created``
        are added when ``config`` lacks them. A new record also writes the ``.graft-run`` marker.

        Args:
            config: the resolved config (spec texts, model ids and checkpoint hashes, dataset
                manifest, seed, ...). Must be JSON-serialisable after :func:`to_json`.
            key: the fields that must match to resume (dotted paths reach into nested
                dicts, e.g. ``"models.sft.revision"``). Default: every top-level field
                except the volatile ones (:data:`VOLATILE_FIELDS`).
            overwrite: discard the folder's previous results (:meth:`clear`) and start anew.

        Returns:
            The config now stored in ``config.json``.

        Raises:
            RunFolderError: the folder holds a config (or results) but no marker.
            ConfigMismatchError: a stored config differs in a ``key`` field.
            DamagedFileError: the stored ``config.json`` is not a JSON object (and not
                ``overwrite``).
        """
        new: dict[str, Any] = to_json(dict(config))
        new.setdefault("packages", package_versions())
        new.setdefault("git_commit", git_commit())
        new.setdefault("git_dirty", git_dirty())
        new.setdefault("machine", machine_info())
        new.setdefault("command", command_line())
        new.setdefault("created", _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
        if overwrite:
            self.clear()
        else:
            self.check_config(new, key)
        self.remove_strays()
        old = self.read_config()
        if old is None:
            self.mark()
            new["run_key"] = self.run_key = config_key(new, key)
            self._store_config(new)
            return new
        # Same computation: keep the original record, note what this invocation ran with.
        changed = {
            f: new[f] for f in new if f not in ("created", "resumes") and old.get(f) != new[f]
        }
        old.setdefault("resumes", []).append({"time": new["created"], "changed": changed})
        # the recorded key stays (the parts record it), a config of graft before it gets one
        self.run_key = old.setdefault("run_key", config_key(old, key))
        self._store_config(old)
        return old

    def _store_config(self, config: dict[str, Any]) -> None:
        with writing("the run config", self.config_path):
            write_json_atomic(self.config_path, config)

    def remove_strays(self) -> list[Path]:
        """Remove the temp files an interrupted write left anywhere in the folder (an
        :func:`~graft.storage.files.atomic_path` temp or a writability probe); return them.
        Only the process that holds the folder may call this (it would take another
        writer's temp file)."""
        if not self.path.is_dir():
            return []
        strays = [p for p in self.path.rglob(".*.tmp") if _STRAY_RE.match(p.name)]
        for stray in strays:
            with contextlib.suppress(FileNotFoundError):
                stray.unlink()
        return strays

    def undo_start(self, existed: bool) -> bool:
        """Remove what :meth:`write_config` wrote for a new run when no part was stored yet
        (a run that failed at its first batch leaves the folder as it was); the folder too
        unless it ``existed`` before. Return whether anything was removed."""
        stored = self.parts_path.is_dir() and any(
            p.name.endswith(".parquet") for p in self.parts_path.rglob("*")
        )
        if stored or not self.marker_path.is_file():
            return False
        shutil.rmtree(self.parts_path, ignore_errors=True)
        for file in (self.config_path, self.marker_path):
            with contextlib.suppress(FileNotFoundError):
                file.unlink()
        if not existed:
            with contextlib.suppress(OSError):
                self.path.rmdir()  # only when empty: nothing else of it is deleted
        return True

    def clear(self) -> None:
        """Remove what this class writes: config, batch parts, combined tables, summary.

        Raises:
            RunFolderError: the folder holds such files but no marker (not graft's to clear).
        """
        self.check_owned()
        names = [p.name for p in self.parts_path.iterdir()] if self.parts_path.is_dir() else []
        shutil.rmtree(self.parts_path, ignore_errors=True)
        for file in [
            self.config_path,
            *(self.path / f"{n}.parquet" for n in names),
            *self._summary_files(),
            *self._summary_files(CONTRASTS_STEM),
            *self._summary_files(NAME_CONTRASTS_STEM),
            *self.path.glob(".*.tmp"),
        ]:
            with contextlib.suppress(FileNotFoundError):
                file.unlink()

    # ------------------------------------------------------------------ batches
    def _part_dir(self, name: str) -> Path:
        if not _NAME_RE.match(name):
            raise RunFolderError(f"table name {name!r}: use letters, digits and _ . = + -")
        return self.parts_path / name

    def append_batch(self, name: str, df: pl.DataFrame, batch_id: str | int) -> Path:
        """Store one finished batch of table ``name`` (a rerun of a batch id replaces it),
        with its metadata: this run's key, the table, the batch id, rows and digest.

        Raises:
            StorageError: the disk is full (or the folder read-only); nothing is left under
                the part's name.
        """
        target = self._part_dir(name) / _batch_file(batch_id)
        return save_table(df, target, name, self.run_key, str(batch_id))

    def _part_files(self, name: str) -> dict[str, Path]:
        folder = self._part_dir(name)
        if not folder.is_dir():
            return {}
        files = {
            unquote(p.name[: -len(".parquet")]): p
            for p in folder.iterdir()
            if p.name.endswith(".parquet") and not p.name.startswith(".")
        }
        return dict(sorted(files.items(), key=lambda item: _natural_key(item[0])))

    def _part_problem(
        self, name: str, batch_id: str, file: Path
    ) -> tuple[pl.DataFrame | None, str | None]:
        expect = {"run_key": self.run_key, "table": name, "batch": batch_id}
        return table_problem(file, expect)

    def done_batches(self, name: str) -> set[str]:
        """Ids (as strings) of the batches of ``name`` stored and sound.

        Every part is read and checked (:func:`table_problem`): one that is unreadable,
        records another run key, table or batch id, or does not match its digest is moved
        to ``parts/<name>/.set-aside/`` with a warning, and its batch counts as not done.
        """
        done = set()
        for batch_id, file in self._part_files(name).items():
            _, problem = self._part_problem(name, batch_id, file)
            if problem is None:
                done.add(batch_id)
            else:
                self._set_aside(file, batch_id, problem)
        return done

    def _set_aside(self, file: Path, batch_id: str, problem: str) -> Path:
        """Move a bad part into ``.set-aside/`` (never over an earlier one) and warn."""
        folder = file.parent / SET_ASIDE_DIR
        target = folder / file.name
        n = 1
        while target.exists():
            n += 1
            target = folder / f"{file.stem}.{n}{file.suffix}"
        with storage_errors("the run folder", target):
            folder.mkdir(exist_ok=True)
            os.replace(file, target)
        logger.warning(
            "part %s %s; moved it to %s: batch %s runs again", file, problem, target, batch_id
        )
        return target

    def read(self, name: str, batch_column: str | None = None) -> pl.DataFrame:
        """All stored batches of ``name``, in natural order of batch id, each checked.

        Falls back to the combined ``<name>.parquet`` when no parts exist; returns an empty
        frame when neither does. With ``batch_column``, adds the batch id as a first column.

        Raises:
            DamagedFileError: a part (or the combined table) is damaged or not this run's.
        """
        files = self._part_files(name)
        if not files:
            combined = self.path / f"{name}.parquet"
            if not combined.is_file():
                return pl.DataFrame()
            return read_table(combined, name, self.run_key)
        frames = []
        for batch_id, file in files.items():
            frame, problem = self._part_problem(name, batch_id, file)
            if problem is not None or frame is None:
                raise DamagedFileError(
                    f"part {file} {problem}; rerun the experiment with the same --out: it "
                    "sets the part aside and computes its batch again"
                )
            if batch_column is not None:
                frame = frame.select(pl.lit(batch_id).alias(batch_column), pl.all())
            frames.append(frame)
        return pl.concat(frames, how="diagonal_relaxed")

    def finalize(self, name: str, table: pl.DataFrame | None = None) -> Path:
        """Write all batches of ``name`` combined to ``<name>.parquet``; return its path.

        Every part is checked first (:meth:`read`): nothing is written unless all are sound.
        ``table``: the combined batches when the caller has read them (:meth:`read`) already.
        """
        folder = self._part_dir(name)
        if folder.is_dir():
            for stray in folder.glob(".*.tmp"):
                with contextlib.suppress(FileNotFoundError):
                    stray.unlink()
        return self.write_table(name, self.read(name) if table is None else table)

    def write_table(self, name: str, df: pl.DataFrame) -> Path:
        """Write ``<name>.parquet`` atomically with its metadata (this run's key, the table
        name, rows and digest: :func:`read_table` checks them); return its path."""
        return save_table(df, self.path / f"{name}.parquet", name, self.run_key)

    def write_summary(self, df: pl.DataFrame, stem: str = SUMMARY_STEM) -> tuple[Path, Path]:
        """Write ``<stem>.parquet`` (with metadata, :meth:`write_table`) and ``<stem>.csv``;
        nested columns become JSON in the CSV."""
        parquet = self.write_table(stem, df)
        return parquet, write_csv(df, self.path / f"{stem}.csv")

    def write_json(self, filename: str, obj: Any) -> Path:
        """Write ``obj`` as JSON to ``path / filename`` atomically (e.g. a drop report)."""
        with writing(filename, self.path / filename):
            return write_json_atomic(self.path / filename, obj)
