"""Resumable run folders: a resolved config plus batch-wise result tables.

Layout of a run folder::

    <out>/.graft-run               marker: graft wrote this folder (only such folders are cleared)
    <out>/config.json              resolved config (written once; checked on resume)
    <out>/parts/<name>/<batch>.parquet   one file per finished batch
    <out>/<name>.parquet           all batches combined (finalize)
    <out>/summary.parquet, .csv    the summary table
    <out>/contrasts.parquet, .csv  paired contrasts of key graft pairs (when the run has any)

Every file is written to a temp file in the same folder and moved into place with
``os.replace`` (:func:`graft.results.files.atomic_path`), so an interrupted run loses at most
the batch in flight and never leaves a half-written table under a real name. Stray temp files
(``.*.tmp``) are ignored by readers and removed by :meth:`RunFolder.finalize` and
:meth:`RunFolder.clear`.

Nothing is written before the first :meth:`RunFolder.write_config` (constructing a
``RunFolder`` creates no folder), and a folder holding a ``config.json`` without the marker
(say, a model folder) is neither resumed nor cleared.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import polars as pl

from graft.errors import ConfigMismatchError, RunFolderError
from graft.results.files import atomic_path, flat_table, to_json, write_json_atomic
from graft.results.provenance import git_commit, package_versions

CONFIG_FILE = "config.json"
MARKER_FILE = ".graft-run"
PARTS_DIR = "parts"
SUMMARY_STEM = "summary"
CONTRASTS_STEM = "contrasts"
#: The key contrasts on whole-name scores (runs with ``score_full_name``).
NAME_CONTRASTS_STEM = "contrasts_name"
# Fields that describe the environment of one invocation, not what was computed: ignored
# by the resume check when the caller gives no explicit key.
VOLATILE_FIELDS = frozenset({"created", "packages", "git_commit", "resumes"})
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.=+-]*$")


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


class RunFolder:
    """A resumable output folder of one experiment run.

    Attributes:
        path: the folder (created by the first write, not on construction).
        config_path: ``path / "config.json"``.
        parts_path: ``path / "parts"``: one sub-folder of batch files per table name.
        marker_path: ``path / ".graft-run"``: written with the config; marks the folder as
            graft's, so :meth:`clear` may delete what it holds.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.config_path = self.path / CONFIG_FILE
        self.parts_path = self.path / PARTS_DIR
        self.marker_path = self.path / MARKER_FILE

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
        created: list[Path] = []
        parent = self.path
        while not parent.exists() and parent != parent.parent:
            created.append(parent)
            parent = parent.parent
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            handle, probe = tempfile.mkstemp(dir=self.path, prefix=".graft-probe-", suffix=".tmp")
            os.close(handle)
            os.unlink(probe)
        except OSError as err:
            reason = err.strerror or type(err).__name__
            raise RunFolderError(
                f"cannot write the run folder {self.path} ({reason}); choose a writable folder"
            ) from None
        finally:
            for folder in created:  # deepest first
                with contextlib.suppress(OSError):
                    folder.rmdir()

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
            with atomic_path(self.marker_path) as tmp:
                tmp.write_text("written by graft; --overwrite may clear this folder\n")

    def _summary_files(self, stem: str = SUMMARY_STEM) -> list[Path]:
        return [self.path / f"{stem}{ext}" for ext in (".parquet", ".csv")]

    # ------------------------------------------------------------------ config
    def read_config(self) -> dict[str, Any] | None:
        """The stored config, or None when there is none yet."""
        if not self.config_path.is_file():
            return None
        config: dict[str, Any] = json.loads(self.config_path.read_text(encoding="utf-8"))
        return config

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

        ``packages`` (see :func:`package_versions`), ``git_commit`` and ``created`` are
        added when ``config`` lacks them. A new record also writes the ``.graft-run`` marker.

        Args:
            config: the resolved config (spec texts, model ids and checkpoint hashes, dataset
                manifest, seed, ...). Must be JSON-serialisable after :func:`to_json`.
            key: the fields that must match to resume (dotted paths reach into nested
                dicts, e.g. ``"models.sft.revision"``). Default: every top-level field
                except the volatile ones (``created``, ``packages``, ``git_commit``).
            overwrite: discard the folder's previous results (:meth:`clear`) and start anew.

        Returns:
            The config now stored in ``config.json``.

        Raises:
            RunFolderError: the folder holds a config (or results) but no marker.
            ConfigMismatchError: a stored config differs in a ``key`` field.
        """
        new: dict[str, Any] = to_json(dict(config))
        new.setdefault("packages", package_versions())
        new.setdefault("git_commit", git_commit())
        new.setdefault("created", _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
        if overwrite:
            self.clear()
        else:
            self.check_config(new, key)
        old = self.read_config()
        if old is None:
            self.mark()
            write_json_atomic(self.config_path, new)
            return new
        # Same computation: keep the original record, note what this invocation ran with.
        changed = {
            f: new[f] for f in new if f not in ("created", "resumes") and old.get(f) != new[f]
        }
        old.setdefault("resumes", []).append({"time": new["created"], "changed": changed})
        write_json_atomic(self.config_path, old)
        return old

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
        """Store one finished batch of table ``name`` (a rerun of a batch id replaces it)."""
        target = self._part_dir(name) / _batch_file(batch_id)
        with atomic_path(target) as tmp:
            df.write_parquet(tmp)
        return target

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

    def done_batches(self, name: str) -> set[str]:
        """Ids (as strings) of the batches of ``name`` already stored."""
        return set(self._part_files(name))

    def read(self, name: str, batch_column: str | None = None) -> pl.DataFrame:
        """All stored batches of ``name``, in natural order of batch id.

        Falls back to the combined ``<name>.parquet`` when no parts exist; returns an empty
        frame when neither does. With ``batch_column``, adds the batch id as a first column.
        """
        files = self._part_files(name)
        if not files:
            combined = self.path / f"{name}.parquet"
            return pl.read_parquet(combined) if combined.is_file() else pl.DataFrame()
        frames = []
        for batch_id, file in files.items():
            frame = pl.read_parquet(file)
            if batch_column is not None:
                frame = frame.select(pl.lit(batch_id).alias(batch_column), pl.all())
            frames.append(frame)
        return pl.concat(frames, how="diagonal_relaxed")

    def finalize(self, name: str) -> Path:
        """Write all batches of ``name`` combined to ``<name>.parquet``; return its path."""
        folder = self._part_dir(name)
        if folder.is_dir():
            for stray in folder.glob(".*.tmp"):
                with contextlib.suppress(FileNotFoundError):
                    stray.unlink()
        df = self.read(name)
        target = self.path / f"{name}.parquet"
        with atomic_path(target) as tmp:
            df.write_parquet(tmp)
        return target

    # ------------------------------------------------------------------ other outputs
    def write_summary(self, df: pl.DataFrame, stem: str = SUMMARY_STEM) -> tuple[Path, Path]:
        """Write ``<stem>.parquet`` and ``<stem>.csv``; nested columns become JSON in the CSV."""
        parquet, csv = self._summary_files(stem)
        with atomic_path(parquet) as tmp:
            df.write_parquet(tmp)
        with atomic_path(csv) as tmp:
            flat_table(df).write_csv(tmp)
        return parquet, csv

    def write_json(self, filename: str, obj: Any) -> Path:
        """Write ``obj`` as JSON to ``path / filename`` atomically (e.g. a drop report)."""
        return write_json_atomic(self.path / filename, obj)
