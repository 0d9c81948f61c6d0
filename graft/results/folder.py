"""Resumable run folders: a resolved config plus batch-wise result tables.

Layout of a run folder::

    <out>/.graft-run               marker: graft wrote this folder (only such folders are
                                   cleared); it keeps a copy of config.json (graft-exp repair)
    <out>/config.json              resolved config (written once; checked on resume; a resume's
                                   changes are stored after the tables they shape)
    <out>/run.log                  everything the run said (graft.results.run_log; appended
                                   by each resume)
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
of its content (:func:`frame_digest`); combined and summary tables also the digest of the
options they were computed with (:func:`~graft.results.run_config.options_digest`), which
readers check against ``config.json``'s. On resume every part is checked (:meth:`RunFolder.
done_batches`): a damaged part, or one of another run, table or batch, is moved to
``parts/<name>/.set-aside/`` with a warning and its batch runs again. Reading a table back
(:meth:`RunFolder.read`, :func:`read_table`) checks it the same way and raises one
:class:`~graft.errors.DamagedFileError` line naming the file and the fix. Parts and tables
without ``graft.*`` metadata (written by graft versions before it) are read as they are,
unchecked, when they parse.

The config's run key and comparison are :mod:`graft.results.run_config`'s, the tables
(parts, their checks, the combined and summary tables) :mod:`graft.results.run_tables`'.

Nothing is written before the first :meth:`RunFolder.write_config` (constructing a
``RunFolder`` creates no folder), and a folder holding a ``config.json`` without the marker
(say, a model folder) is neither resumed nor cleared.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from graft.errors import ConfigMismatchError, RunFolderError
from graft.results.provenance import (
    command_line,
    git_commit,
    git_dirty,
    machine_info,
    package_versions,
)
from graft.results.run_config import (
    CONFIG_FILE,
    config_changes,
    config_key,
    options_digest,
    read_config_file,
)
from graft.results.run_log import LOG_NAME
from graft.results.run_tables import (
    CONTRASTS_STEM,
    NAME_CONTRASTS_STEM,
    PARTS_DIR,
    SET_ASIDE_DIR,
    SUMMARY_STEM,
    RunTables,
    refuse_special_files,
)
from graft.storage.failures import printable
from graft.storage.files import (
    atomic_path,
    check_commit,
    probe_writable,
    remove_empty,
    to_json,
    utc_timestamp,
    write_json_atomic,
)
from graft.storage.paths import path_problem
from graft.storage.tables import writing

# SET_ASIDE_DIR and RunFolderError as the tests import them from here
__all__ = ["MARKER_FILE", "SET_ASIDE_DIR", "RunFolder", "RunFolderError"]

MARKER_FILE = ".graft-run"
MARKER_NOTE = "written by graft; --overwrite may clear this folder"
#: What config.json keeps of the run that created the folder (later runs: in ``resumes``).
FIRST_RUN_FIELDS = ("packages", "git_commit", "git_dirty", "machine", "command", "run_key")
# the temp files of atomic_path (.<name>.<pid>.<8 hex>.tmp) and check_writable's probes
_STRAY_RE = re.compile(r"^\.(.+\.\d+\.[0-9a-f]{8}|graft-probe-.+)\.tmp$")


class RunFolder(RunTables):
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
        started: whether this object wrote the marker (or the config): from then on every
            write checks that the marker is still there (:meth:`check_present`).
        options_digest: the digest of the options the tables are computed with (those the
            last :meth:`write_config` was given); every combined and summary table records
            it, and readers refuse one whose digest is not ``config.json``'s.
        pending: a resumed run's record (its changed options, its ``resumes`` entry) that
            :meth:`commit_config` stores once the tables it describes are written; None
            when nothing waits.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.config_path = self.path / CONFIG_FILE
        self.parts_path = self.path / PARTS_DIR
        self.marker_path = self.path / MARKER_FILE
        self.run_key = ""
        self.started = False
        self.options_digest = ""
        self.pending: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    # ------------------------------------------------------------------ checks
    def check_writable(self) -> None:
        """Raise :class:`RunFolderError` unless the folder can be created and written.

        Probes by creating the folder (and its missing parents) and a temp file in it, then
        removes all of that again: the file system is left as it was.
        """
        problem = path_problem(self.path)
        if problem:
            raise RunFolderError(f"run folder {printable(self.path)} {problem}")
        if self.path.exists() and not self.path.is_dir():
            raise RunFolderError(f"run folder {self.path} is a file; choose a folder path")
        try:
            remove_empty(probe_writable(self.path))
        except OSError as err:
            reason = err.strerror or type(err).__name__
            raise RunFolderError(
                f"cannot write the run folder {self.path} ({reason}); choose a writable folder"
            ) from None

    def state_line(self, overwrite: bool) -> str:
        """The one line naming the folder and what a run does to it, said before any work."""
        if not self.config_path.is_file():
            state = "new"
        else:
            state = "overwriting its old results" if overwrite else "resuming it"
        return f"run folder: {self.path} ({state})"

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
        resume or clear (a model folder, or another program's output). A special file in it
        (a FIFO: opening it would wait forever) is refused first, its parts' aside: a
        rerun sets those aside itself."""
        refuse_special_files(self.path, parts=False)
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
                tmp.write_text(json.dumps({"note": MARKER_NOTE}))
        self.started = self.marker_path.is_file()

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
        changes = config_changes(old, to_json(dict(config)), key)
        if changes:
            raise ConfigMismatchError(
                f"{self.path} holds results of a different configuration ({changes}); "
                "use a new --out folder, or --overwrite to discard the old results (if its "
                f"config.json was replaced by another run's: graft-exp repair {self.path})."
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
                except the volatile ones
                (:data:`~graft.results.run_config.VOLATILE_FIELDS`).
            overwrite: discard the folder's previous results (:meth:`clear`) and start anew.

        A resumed run's record (what it changed, each resume's entry) is not stored here
        but kept in :attr:`pending` until :meth:`commit_config`, once the tables it
        describes are rewritten: a rerun with another ``--n-boot`` stopped before its
        summaries leaves the old record over the old tables (and a table rewritten before
        the stop records the new options' digest, which readers refuse against the old
        record).

        Returns:
            The config the run records (stored in ``config.json`` for a new run; for a
            resumed one, once committed).

        Raises:
            RunFolderError: the folder holds a config (or results) but no marker.
            ConfigMismatchError: a stored config differs in a ``key`` field.
            DamagedFileError: the stored ``config.json`` is not a JSON object (and not
                ``overwrite``).
        """
        new: dict[str, Any] = to_json(dict(config))
        fill: dict[str, Callable[[], Any]] = {
            "packages": package_versions,
            "git_commit": git_commit,
            "git_dirty": git_dirty,
            "machine": machine_info,
            "command": command_line,
            "created": utc_timestamp,
        }
        for name, made in fill.items():  # asked only for what the caller did not record
            if name not in new:
                new[name] = made()
        if overwrite:
            self.clear()
        else:
            self.check_config(new, key)
        self.remove_strays()
        old = self.read_config()
        if old is None:
            self.mark()
            new["run_key"] = self.run_key = config_key(new, key)
            self.options_digest = options_digest(new)
            self.store_config(new)
            return new
        if not self.marker_path.is_file():  # a graft before the marker: it gets one now
            self.store_config(old)  # the record as it is (this resume's is committed later)
        self.started = True
        # Same computation. The record states what the tables were last computed with (a
        # rerun with --n-boot 20 rebuilds the summary with 20); the first run's provenance
        # stays, and each resume notes what it changed and what was recorded before.
        changed = {
            f: new[f] for f in new if f not in ("created", "resumes") and old.get(f) != new[f]
        }
        before = {f: old.get(f) for f in changed if f not in FIRST_RUN_FIELDS}
        old.setdefault("resumes", []).append(
            {"time": new["created"], "changed": changed, "before": before}
        )
        old.update({f: changed[f] for f in before})
        # the recorded key stays (the parts record it), a config of graft before it gets one
        self.run_key = old.setdefault("run_key", config_key(old, key))
        self.options_digest = options_digest(old)
        self.pending = old
        return old

    def commit_config(self) -> None:
        """Store the record :meth:`write_config` kept for a resumed run (:attr:`pending`):
        call it once every table the run derives is written. Nothing when none waits."""
        if self.pending is not None:
            self.store_config(self.pending)
            self.pending = None

    def store_config(self, config: dict[str, Any]) -> None:
        """Write ``config`` as the folder's ``config.json``, and its copy into the marker."""
        self.check_present()
        with writing("the run config", self.config_path):
            write_json_atomic(self.config_path, config)
        # the marker keeps a copy: `graft-exp repair` restores a replaced or damaged config.json
        with writing("the run folder's marker", self.marker_path):
            write_json_atomic(self.marker_path, {"note": MARKER_NOTE, "config": config})
        self.started = True

    def remove_strays(self) -> list[Path]:
        """Remove the temp files an interrupted write left anywhere in the folder (an
        :func:`~graft.storage.files.atomic_path` temp or a writability probe); return them.
        Only the process that holds the folder may call this (it would take another
        writer's temp file)."""
        if not self.path.is_dir():
            return []
        strays = [p for p in self.path.rglob(".*.tmp") if _STRAY_RE.match(p.name)]
        if strays:
            check_commit()  # another holder's temp files, if this process lost its lock
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
        check_commit()
        shutil.rmtree(self.parts_path, ignore_errors=True)
        for file in (self.config_path, self.marker_path, self.path / LOG_NAME):
            with contextlib.suppress(FileNotFoundError):
                file.unlink()
        if not existed:
            with contextlib.suppress(OSError):
                self.path.rmdir()  # only when empty: nothing else of it is deleted
        return True

    def clear(self) -> None:
        """Remove what this class writes: config, run log, batch parts, combined tables,
        summary.

        Raises:
            RunFolderError: the folder holds such files but no marker (not graft's to clear).
        """
        self.check_owned()
        names = [p.name for p in self.parts_path.iterdir()] if self.parts_path.is_dir() else []
        check_commit()
        shutil.rmtree(self.parts_path, ignore_errors=True)
        for file in [
            self.config_path,
            self.path / LOG_NAME,
            *(self.path / f"{n}.parquet" for n in names),
            *self._summary_files(),
            *self._summary_files(CONTRASTS_STEM),
            *self._summary_files(NAME_CONTRASTS_STEM),
            *self.path.glob(".*.tmp"),
        ]:
            with contextlib.suppress(FileNotFoundError):
                file.unlink()
