"""Reporting a command's work to the trackers users already look at: TensorBoard or Weights
& Biases (``--report-to``), through their own libraries, which the optional ``tracking``
extra installs.

While :func:`reporting` is active, a finetune's Trainer reports its losses to the tracker
(:func:`trainer_reporting`: the Trainer's own ``report_to`` callbacks), and after a run
:func:`log_results` sends the run's summary metrics, its table and its figures. Everything
goes under one folder (a run folder's ``tracking/``): TensorBoard's event files in
``tensorboard/<run name>/``, W&B's run folders in ``wandb/``. W&B runs offline (its runs
kept in that folder, to upload later with ``wandb sync``) when ``WANDB_MODE`` says so, or
when no API key is configured or its server does not answer within a second; that choice is
said in a warning. Nothing heavy is imported here until a tracker is used: the command line
checks a tracker's package (:func:`missing_package`) before any work.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import re
import socket
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from graft.errors import InputError

logger = logging.getLogger(__name__)

#: ``--report-to``'s choices.
TRACKERS = ("none", "tensorboard", "wandb")
#: The package each tracker needs (the ``tracking`` extra installs both).
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}
#: How a user installs them.
INSTALL_HINT = "pip install 'graft-interp[tracking]'"
#: The W&B project graft's runs go to unless ``WANDB_PROJECT`` names another.
DEFAULT_PROJECT = "graft"
#: Seconds the W&B server has to answer before a run goes offline.
PROBE_TIMEOUT_S = 1.0

_ACTIVE: ContextVar[Tracking | None] = ContextVar("graft_tracking", default=None)


@dataclass(frozen=True)
class Tracking:
    """Where and how a command reports.

    Args:
        tracker: ``"tensorboard"`` or ``"wandb"``.
        folder: the folder the tracker writes into (``tensorboard/`` or ``wandb/`` inside).
        group: what the command's runs are grouped under (a W&B group; the prefix of every
            TensorBoard run name): the run folder's name.
        wandb_mode: ``"online"`` or ``"offline"`` (``None`` for TensorBoard).
        offline_reason: why graft chose W&B's offline mode (no API key, the server does not
            answer); ``None`` when it did not (online, TensorBoard, ``WANDB_MODE`` given).
    """

    tracker: str
    folder: Path
    group: str
    wandb_mode: str | None = None
    offline_reason: str | None = None

    def record(self) -> dict[str, str | None]:
        """What a run's ``config.json`` records of its reporting (``tracking``)."""
        return {
            "tracker": self.tracker,
            "folder": str(self.folder),
            "wandb_mode": self.wandb_mode,
            "offline_reason": self.offline_reason,
        }

    @property
    def tensorboard_dir(self) -> Path:
        return self.folder / "tensorboard"


def missing_package(tracker: str) -> str | None:
    """One line saying how to install ``tracker``'s package when it is missing; None when it
    is installed (or ``tracker`` is ``"none"``). Imports nothing."""
    package = PACKAGES.get(tracker)
    if package is None or importlib.util.find_spec(package) is not None:
        return None
    return (
        f"--report-to {tracker} needs the {package} package, which is not installed: "
        f"{INSTALL_HINT} (or pip install {package})"
    )


def _wandb_key() -> bool:
    """Whether a W&B API key is configured (``WANDB_API_KEY``, or ``wandb login``'s netrc
    entry)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    try:
        return "api.wandb.ai" in netrc.read_text() or "WANDB_BASE_URL" in os.environ
    except OSError:
        return False


def _answers(url: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether ``url``'s host accepts a TCP connection within ``timeout`` seconds."""
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme != "http" else 80)
    try:
        with socket.create_connection((parsed.hostname or "", port), timeout=timeout):
            return True
    except OSError:
        return False


def wandb_mode() -> tuple[str, str | None]:
    """W&B's mode and, when graft chose offline, why: ``WANDB_MODE`` when set; else offline
    without an API key or when the server does not answer; else online."""
    given = os.environ.get("WANDB_MODE")
    if given:
        return given, None
    if not _wandb_key():
        return "offline", "no W&B API key (WANDB_API_KEY or wandb login)"
    url = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
    if not _answers(url):
        return "offline", f"{urlparse(url).hostname} does not answer"
    return "online", None


def tracking_for(tracker: str, folder: Path, group: str) -> Tracking | None:
    """The :class:`Tracking` of ``--report-to tracker`` writing under ``folder`` (None for
    ``"none"``); for W&B the mode is decided here, an offline one said in one line."""
    if tracker == "none":
        return None
    if tracker not in TRACKERS:
        raise InputError(f"unknown tracker {tracker!r}; choose one of {', '.join(TRACKERS)}")
    mode = why = None
    if tracker == "wandb":
        mode, why = wandb_mode()
        if why:
            logger.warning(
                "W&B offline (%s): runs kept in %s; upload them with wandb sync",
                why,
                folder / "wandb",
            )
    return Tracking(tracker, Path(folder), _slug(group), mode, why)


def _slug(text: str) -> str:
    return re.sub(r"[^\w.+=-]+", "-", text).strip("-") or "run"


def current() -> Tracking | None:
    """The active :class:`Tracking` (:func:`reporting`), or None."""
    return _ACTIVE.get()


#: W&B's environment while graft reports: a quiet console, no capture of the terminal.
_WANDB_QUIET = {"WANDB_SILENT": "true", "WANDB_CONSOLE": "off"}


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` in ``os.environ`` inside (the trackers read their settings from it)."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def reporting(tracking: Tracking | None) -> Iterator[None]:
    """Inside: ``tracking`` is active (None: nothing is reported). For W&B its folder,
    project, group and mode are in the environment, where the Trainer's callback reads them
    (a user's own ``WANDB_PROJECT``, ``WANDB_SILENT`` and ``WANDB_CONSOLE`` are kept)."""
    env: dict[str, str] = {}
    if tracking is not None and tracking.tracker == "wandb":
        env = {
            **{k: v for k, v in _WANDB_QUIET.items() if k not in os.environ},
            "WANDB_PROJECT": os.environ.get("WANDB_PROJECT", DEFAULT_PROJECT),
            "WANDB_DIR": str(tracking.folder),
            "WANDB_MODE": tracking.wandb_mode or "offline",
            "WANDB_RUN_GROUP": tracking.group,
        }
    token = _ACTIVE.set(tracking)
    try:
        with _environment(env):
            yield
    finally:
        _ACTIVE.reset(token)


@contextlib.contextmanager
def trainer_reporting(name: str) -> Iterator[tuple[list[str], str | None]]:
    """For a Trainer built inside: its ``report_to`` (``["none"]`` when nothing is active)
    and run name (``<group>/<name>``); TensorBoard's callback, which reads its folder when it
    is built, writes into ``tensorboard/<group>/<name>``."""
    tracking = current()
    if tracking is None:
        yield ["none"], None
        return
    run = f"{tracking.group}/{_slug(name)}"
    env = {}
    if tracking.tracker == "tensorboard":
        env["TENSORBOARD_LOGGING_DIR"] = str(tracking.tensorboard_dir / run)
    else:  # W&B wants its folder to exist (made only now: a refused run leaves none)
        tracking.folder.mkdir(parents=True, exist_ok=True)
    with _environment(env):
        yield [tracking.tracker], run


def finish_trainer_run() -> None:
    """End the W&B run a Trainer's callback started (the next one starts anew); nothing
    for TensorBoard, whose callback closes its writer itself."""
    tracking = current()
    if tracking is None or tracking.tracker != "wandb":
        return
    import wandb

    if wandb.run is not None:
        wandb.finish()


def close(tracking: Tracking | None) -> None:
    """At a command's end: wait until W&B has written every run (its service writes the run
    files after ``finish`` returns; at exit an ``atexit`` hook would, but a command may run
    inside a notebook or a test that reads them next)."""
    if tracking is None or tracking.tracker != "wandb":
        return
    import wandb

    wandb.teardown()


# ------------------------------------------------------------------ a run's results


def summary_metrics(summary: Any) -> dict[str, float]:
    """``<row name>/<statistic>`` -> value for every row of a summary table. A row is named
    by its text columns (template, graft, group) and, where they vary, its seed columns
    (``data_seed=1``); its statistics are the other numbers, their interval bounds left out."""
    import polars as pl

    text = [c for c, t in summary.schema.items() if t in (pl.Utf8, pl.Categorical)]
    text = [c for c in text if not c.endswith("_ci_method") and c != "dropped_reasons"]
    seeds = [c for c in summary.columns if c.endswith("seed")]
    varying = [c for c in seeds if summary[c].n_unique() > 1]
    stats = [
        c
        for c, t in summary.schema.items()
        if t.is_numeric() and c not in seeds and not c.endswith(("_lo", "_hi")) and c != "n_dropped"
    ]
    metrics: dict[str, float] = {}
    for row in summary.iter_rows(named=True):
        parts = [str(row[c]) for c in text if row[c] not in (None, "")]
        parts += [f"{c}={row[c]}" for c in varying if row[c] is not None]
        name = "/".join(parts)
        for stat in stats:
            if row[stat] is not None:
                metrics[f"{name}/{stat}" if name else stat] = float(row[stat])
    return metrics


def log_results(
    tracking: Tracking,
    name: str,
    folder: Path,
    figures: Sequence[Path] = (),
) -> dict[str, float]:
    """Send the run in ``folder`` (its ``summary.parquet``, ``config.json`` and the PNG
    ``figures``) to the tracker as the run ``<group>/<name>``; its summary metrics (none
    when the folder has no summary: its figures and config still go)."""
    import polars as pl

    from graft.results.run_tables import read_recorded

    path = folder / "summary.parquet"
    # checked as plot checks it: a table of another run or other options is one line
    summary = read_recorded(path) if path.is_file() else pl.DataFrame()
    metrics = summary_metrics(summary)
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    run = f"{tracking.group}/{_slug(name)}" if name else tracking.group
    if tracking.tracker == "tensorboard":
        _tensorboard_results(tracking.tensorboard_dir / run, metrics, summary, config, figures)
    else:
        with reporting(tracking):
            _wandb_results(run, metrics, summary, config, figures)
    logger.info("reported %d metrics and %d figures to %s", len(metrics), len(figures), run)
    return metrics


def _tensorboard_results(
    where: Path, metrics: dict[str, float], summary: Any, config: dict, figures: Sequence[Path]
) -> None:
    import numpy as np
    from PIL import Image
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(where))
    try:
        for tag, value in metrics.items():
            writer.add_scalar(f"summary/{tag}", value, 0)
        if summary.width:
            writer.add_text("summary", _markdown(summary), 0)
        writer.add_text("config", f"```\n{json.dumps(config, indent=1, default=str)}\n```", 0)
        for png in figures:
            with Image.open(png) as image:
                pixels = np.asarray(image.convert("RGB"))
            writer.add_image(f"figures/{png.stem}", pixels, 0, dataformats="HWC")
    finally:
        writer.close()


def _wandb_results(
    run: str, metrics: dict[str, float], summary: Any, config: dict, figures: Sequence[Path]
) -> None:
    import wandb

    Path(os.environ["WANDB_DIR"]).mkdir(parents=True, exist_ok=True)
    active = wandb.init(
        name=run, job_type="results", config=_wandb_config(config), dir=os.environ["WANDB_DIR"]
    )
    try:
        active.summary.update(metrics)
        logged: dict[str, Any] = {f"figures/{p.stem}": wandb.Image(str(p)) for p in figures}
        if summary.width:
            rows = [list(r) for r in summary.iter_rows()]
            logged["summary_table"] = wandb.Table(columns=summary.columns, data=rows)
        if logged:
            active.log(logged)
    finally:
        active.finish()


def _wandb_config(config: dict) -> dict:
    """The run's ``config.json`` without its bulky per-run parts (the rows' provenance)."""
    return {k: v for k, v in config.items() if not isinstance(v, list) or len(v) < 50}


def _markdown(summary: Any) -> str:
    """The summary table as Markdown (TensorBoard's text panel renders it)."""
    lines = ["| " + " | ".join(summary.columns) + " |", "|" + "---|" * len(summary.columns)]
    for row in summary.iter_rows():
        cells = [f"{v:.4g}" if isinstance(v, float) else str(v) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
