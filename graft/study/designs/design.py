"""An experiment as a library object: a :class:`Design` says which runs it needs (each a
:class:`~graft.study.specs.request.RunRequest` for the one runner), how their tables combine
and which figures it draws; :func:`run_design` runs any design, :func:`plan_design` plans it
without loading a model. The paper's experiments are functions that build designs
(:mod:`graft.study.designs.paper`, :mod:`graft.study.designs.component`,
:mod:`graft.study.designs.lens`, :mod:`graft.study.designs.patching`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graft.results.folder import RunFolder
from graft.results.report import draw_figures
from graft.results.tracking import Tracking
from graft.study.planning.run_plan import ExperimentPlan, plan_experiment
from graft.study.running.runner import (
    ExperimentRun,
    check_request,
    folder_line,
    run_experiment,
)
from graft.study.running.summaries import print_summary
from graft.study.specs.request import RunRequest

#: How a design's own results are made from its finished runs: the design's run, filled in
#: by :func:`run_design` (its ``runs``), gets its ``files``, ``lines`` and ``result`` here.
Finish = Callable[["DesignRun"], None]


@dataclass(frozen=True)
class Design:
    """An experiment: the runs it needs and what is made of them.

    Args:
        experiment: the experiment's name (``position``, ``component``, ...).
        folder: where the design's results go: the run folder of a one-run design, the
            folder holding each run's folder (``<folder>/<name>``) and the combined
            results of a design of several runs.
        runs: run name -> its request, in run order; a one-run design's single run is
            named ``""`` and writes into ``folder`` itself.
        notes: lines said before the runs (e.g. what of the paper's protocol a run does not
            reproduce; also stored in each run's ``config.json``).
        finish: writes the design's own tables from its finished runs (top-1 kinds, a
            combined summary, a patching sweep's report), or None.
        figures: draw each run's bar charts (and the combined folder's, where ``finish``
            wrote a summary there).
    """

    experiment: str
    folder: Path
    runs: dict[str, RunRequest]
    notes: tuple[str, ...] = ()
    finish: Finish | None = None
    figures: bool = True


@dataclass
class DesignRun:
    """What running a :class:`Design` produced.

    Args:
        design: the design that ran.
        runs: run name -> what that run produced.
        files: the design's own tables and files (name -> path), beside its runs' tables.
        figures: every figure drawn (PNG paths).
        lines: the design's own summary, one line each (what a command prints last).
        result: the design's own result object, where it has one (the lens's
            :class:`~graft.study.analyses.lens.LensRun`, a patching sweep's report).
    """

    design: Design
    runs: dict[str, ExperimentRun]
    files: dict[str, Path] = field(default_factory=dict)
    figures: list[Path] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    result: Any = None

    @property
    def run(self) -> ExperimentRun:
        """The run of a one-run design (its first run otherwise)."""
        return next(iter(self.runs.values()))


def run_design(
    design: Design,
    echo: Callable[[str], None] | None = None,
    metric: str = "acc@5",
    report_to: str = "none",
) -> DesignRun:
    """Run every run of ``design`` with the one runner (each resumable), then its
    ``finish`` and figures; every run's checks that need no model or dataset
    (:func:`~graft.study.running.runner.check_request`) pass before the first starts.
    ``echo`` gets the notes, each run's folder, plan line, summary and stage times, the
    design's own lines, and each figure's path (default: nothing is said).

    ``report_to`` (a tracker of :data:`graft.results.TRACKERS` other than ``none``): the
    donor finetunes report to it while they train, then each run's (and the combined
    folder's) summary and figures, under ``<folder>/tracking``."""
    if report_to != "none":
        return _run_reporting(design, report_to, echo, metric)
    say = echo or (lambda _line: None)
    if len(design.runs) > 1:  # the combined results go into the folder itself: graft's
        RunFolder(design.folder).check_owned()
        for request in design.runs.values():  # a later run's refusal, before the first runs
            check_request(request)
    for note in design.notes:
        say(f"note: {note}")
    done = DesignRun(design, {})
    for name, request in design.runs.items():
        if len(design.runs) > 1:
            say(f"{name}: {len(request.grafts)} grafts")
        run = run_experiment(request, echo=echo)
        print_summary(run.summary, metric, echo=say)
        say(f"results: {run.folder.path}")
        say(run.times.line())
        done.runs[name] = run
    if design.finish is not None:
        design.finish(done)
    for line in done.lines:
        say(line)
    start = time.perf_counter()
    if design.figures:
        folders = [run.folder.path for run in done.runs.values()]
        if (design.folder / "summary.parquet").exists() and design.folder not in folders:
            folders.append(design.folder)
        for folder in folders:
            done.figures += draw_figures(folder, metric)
    for png in done.figures:
        say(f"figure: {png}")
    if design.figures:
        say(f"time: figures {time.perf_counter() - start:.1f} s")
    return done


def _run_reporting(
    design: Design, tracker: str, echo: Callable[[str], None] | None, metric: str
) -> DesignRun:
    """:func:`run_design` reporting to ``tracker``."""
    from graft.results.tracking import close, log_results, reporting, tracking_for

    tracking = tracking_for(tracker, design.folder / "tracking", design.folder.name)
    assert tracking is not None  # tracker is not "none"
    try:
        with reporting(tracking):
            done = run_design(design, echo, metric)
            folders = {run.folder.path: name for name, run in done.runs.items()}
            if (design.folder / "summary.parquet").exists() and design.folder not in folders:
                folders[design.folder] = "combined"
            for folder, name in folders.items():
                figures = [p for p in done.figures if p.is_relative_to(folder / "figures")]
                log_results(tracking, f"results-{name}" if name else "results", folder, figures)
                _record_tracking(RunFolder(folder), tracking)
    finally:
        close(tracking)
    (echo or (lambda _line: None))(f"tracking: {tracking.folder} ({tracker})")
    return done


def _record_tracking(folder: RunFolder, tracking: Tracking) -> None:
    """``folder``'s ``config.json`` (where it has one) records where and how it reported,
    a W&B run that graft sent offline with the reason."""
    config = folder.read_config()
    if config is not None:
        folder.store_config({**config, "tracking": tracking.record()})


def plan_design(design: Design) -> dict[str, ExperimentPlan]:
    """Run name -> the plan of that run of ``design`` (nothing loaded or written), each with
    what the run does to its folder (:func:`~graft.study.running.runner.folder_line`)."""
    plans = {}
    for name, request in design.runs.items():
        plans[name] = plan_experiment(request)
        plans[name].folder = folder_line(request)
    return plans
