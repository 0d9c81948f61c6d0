"""A run folder's tables: each finished batch stored as a part with its marks (run key,
table, batch id, rows, digest), the parts checked on resume and a bad one set aside, read
back and combined, and the summary tables written beside them. :class:`RunTables` is
:class:`~graft.results.folder.RunFolder`'s side of them."""

from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import polars as pl

from graft.errors import DamagedFileError, RunFolderError, StorageError
from graft.results.run_config import recorded_options, recorded_run_key
from graft.storage.failures import storage_errors
from graft.storage.files import check_commit, flat_table, refuse_special_under, write_json_atomic
from graft.storage.tables import read_table, save_table, table_problem, write_csv, writing

logger = logging.getLogger(__name__)

PARTS_DIR = "parts"
SUMMARY_STEM = "summary"
CONTRASTS_STEM = "contrasts"
#: The key contrasts on whole-name scores (runs with ``score_full_name``).
NAME_CONTRASTS_STEM = "contrasts_name"
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.=+-]*$")
#: Where a damaged or foreign part is moved (inside ``parts/<name>/``; readers skip it).
SET_ASIDE_DIR = ".set-aside"


def refuse_special_files(folder: str | os.PathLike[str], parts: bool = True) -> None:
    """Refuse the run folder ``folder`` when a special file (a FIFO, a socket, a device) is
    anywhere in it, before anything in it is opened: one
    :class:`~graft.errors.DamagedFileError` line naming it (parts set aside excepted;
    ``parts=False``: the parts too, which a rerun checks and sets aside itself)."""
    skip = (SET_ASIDE_DIR,) if parts else (SET_ASIDE_DIR, PARTS_DIR)
    refuse_special_under(folder, skip)


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


class RunTables:
    """The tables of a run folder (mixed into :class:`~graft.results.folder.RunFolder`).

    Attributes:
        path: the folder.
        parts_path: ``path / "parts"``: one sub-folder of batch files per table name.
        run_key: the run key every table written records and every part read back must
            record (``""`` before a config is written).
        options_digest: the digest of the options the tables are computed with
            (:func:`~graft.results.run_config.options_digest`), recorded by every combined
            and summary table (not by parts: their content is the run key's); ``""``
            before a config is written.
    """

    path: Path
    parts_path: Path
    marker_path: Path
    run_key: str
    options_digest: str

    def check_present(self) -> None:
        """Before a write into a folder this object marked (``started``): raise :class:`~graft.errors.RunFolderError` when
        its marker is gone (the folder was deleted or moved while this run wrote it), so
        that no write re-creates part of it (which a rerun would refuse as no run folder
        of graft's) and no summary is made of the parts left."""
        if getattr(self, "started", False) and not self.marker_path.is_file():
            raise RunFolderError(
                f"the run folder {self.path} (its {self.marker_path.name} marker) was removed "
                "or moved while this run wrote it; rerun the command: it starts the run anew "
                "there"
            )

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
        self.check_present()
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
            check_commit()
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
            return read_table(combined, name, self.run_key, options=self.options_digest)
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
        name, the options' digest, rows and digest: :func:`read_table` checks them); return
        its path."""
        self.check_present()
        path = self.path / f"{name}.parquet"
        return save_table(df, path, name, self.run_key, options=self.options_digest)

    def write_summary(self, df: pl.DataFrame, stem: str = SUMMARY_STEM) -> tuple[Path, Path]:
        """Write ``<stem>.parquet`` (with metadata, :meth:`write_table`) and ``<stem>.csv``;
        nested columns become JSON in the CSV."""
        parquet = self.write_table(stem, df)
        self.check_present()
        return parquet, write_csv(df, self.path / f"{stem}.csv")

    def write_json(self, filename: str, obj: Any) -> Path:
        """Write ``obj`` as JSON to ``path / filename`` atomically (e.g. a drop report)."""
        self.check_present()
        with writing(filename, self.path / filename):
            return write_json_atomic(self.path / filename, obj)


def refresh_mirrors(
    folder: str | os.PathLike[str], run_key: str = "", options: str = ""
) -> list[Path]:
    """Check each CSV mirror of the run folder ``folder`` (``<stem>.csv`` beside a
    ``<stem>.parquet``) against its table, itself checked (:func:`read_table`: ``run_key``
    and ``options`` as there): a mirror that
    differs (edited, or left stale) is rewritten from the table, with a warning; where the
    folder cannot be written (a read-only run) the warning says so. Returns the mirrors that
    differed. ``compare`` and ``plot`` read the parquet tables, never the mirrors; this keeps
    what a person opens equal to them."""
    folder = Path(folder)
    stale = []
    for mirror in sorted(folder.glob("*.csv")):
        table_file = mirror.with_suffix(".parquet")
        if not table_file.is_file():
            continue  # a CSV of the user's (an adapted experiment's score), no mirror
        table = read_table(table_file, table_file.stem, run_key, options=options)
        try:
            same = mirror.read_text(encoding="utf-8") == flat_table(table).write_csv()
        except (OSError, UnicodeDecodeError):
            same = False
        if same:
            continue
        stale.append(mirror)
        try:
            write_csv(table, mirror)
        except StorageError:
            logger.warning(
                "%s differs from %s (edited or stale) and cannot be rewritten here; "
                "read the parquet table",
                mirror,
                table_file.name,
            )
            continue
        logger.warning(
            "%s differed from %s (edited or stale); rewritten from the checked table",
            mirror,
            table_file.name,
        )
    return stale


def read_recorded(path: str | os.PathLike[str]) -> pl.DataFrame:
    """The table at ``path`` (``<stem>.parquet``), checked against its marks and its run
    folder's ``config.json`` (run key and options digest, :func:`read_table`): what publish
    and tracking read, as plot and compare do."""
    path = Path(path)
    folder, stem = path.parent, path.name.removesuffix(".parquet")
    return read_table(path, stem, recorded_run_key(folder), options=recorded_options(folder))


def check_recorded_tables(folder: str | os.PathLike[str]) -> dict[str, pl.DataFrame]:
    """Check every table of the run folder ``folder`` that has a CSV mirror against its
    marks and the folder's ``config.json`` (a table of another run or other options,
    damaged or unmarked: one :class:`~graft.errors.DamagedFileError` line), and each mirror
    against its table (:func:`refresh_mirrors`: rewritten, with a warning). Returns the
    mirrors that still differ (a folder this user may not write): stem -> its checked
    table, flat as a mirror holds it."""
    folder = Path(folder)
    key, options = recorded_run_key(folder), recorded_options(folder)
    left = {}
    for mirror in refresh_mirrors(folder, key, options):
        table = flat_table(
            read_table(mirror.with_suffix(".parquet"), mirror.stem, key, options=options)
        )
        try:
            same = mirror.read_text(encoding="utf-8") == table.write_csv()
        except (OSError, UnicodeDecodeError):
            same = False
        if not same:
            left[mirror.stem] = table
    return left
