"""Figures of a finished run folder, drawn from its saved summary (no recomputation)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import cast

import polars as pl

from graft.errors import ResultsError, RunFolderError
from graft.naming import slug
from graft.results import plots
from graft.results.compare import CONTROL_SUFFIX
from graft.results.paper import numbers as paper_numbers
from graft.results.record import read_run_record
from graft.results.run_config import recorded_options
from graft.results.run_tables import SUMMARY_STEM, refresh_mirrors, refuse_special_files
from graft.storage.failures import printable
from graft.storage.paths import path_problem
from graft.storage.tables import read_table

LAYER_SEP = " | "
#: Donor pairs of the component experiment -> panel titles.
PAIR_LABELS = {
    "sft": "SFT into PRE\n(forward prompts)",
    "reversal": "both-directions model into\none-direction model (reversed prompts)",
}
_REFERENCES = ("PRE", "SFT", "TASK", "RELATION")
_BASE_LEGEND = {"PRE": "PRE: base model alone", "SFT": "SFT: donor alone"}
#: experiment -> (x-axis label, legend texts, footnote sentence) of its bar charts.
_BAR_TEXT: dict[str, tuple[str, dict[str, str], str | None]] = {
    "position": (
        "positions given SFT weights (all layers, all components)",
        {
            "PRE": "PRE: pretrained model",
            "SFT": "SFT: finetuned model",
            plots.GRAFT_KEY: "PRE with SFT weights there",
        },
        None,
    ),
    "necessity": (
        "positions where PRE weights go into SFT (all layers, all components)",
        {
            "SFT": "SFT: finetuned model",
            "PRE": "PRE: pretrained model",
            plots.GRAFT_KEY: "SFT with PRE weights there",
        },
        "Necessity: the finetuned model (SFT) runs with the pretrained (PRE) weights grafted "
        "back at each position set.",
    ),
    "hybrid": (
        "grafts into PRE (FE: task model; LT: task ATTN + relation O+FFN)",
        {
            "PRE": "PRE: pretrained model",
            "TASK": "TASK: finetuned on set A",
            "RELATION": "RELATION: finetuned on set B",
            plots.GRAFT_KEY: "hybrid graft",
        },
        None,
    ),
    "lens": (
        "grafts: the model's output, the final layer of the lens at LT",
        {**_BASE_LEGEND, plots.GRAFT_KEY: "graft"},
        "The model's own output under each graft; the lens figures (lens_*) draw every layer.",
    ),
}
#: experiment -> the first part of its bar charts' file names, where it is not the
#: experiment's name: a lens run's bar charts show the output's accuracy, not a lens.
_BAR_STEMS = {"lens": "final_layer"}


def _int_max(column: pl.Series) -> int:
    """The largest value of an integer column (polars types ``max`` as any Python literal)."""
    return int(cast(int, column.max()))


def figure_rows(summary: pl.DataFrame) -> tuple[pl.DataFrame, str | None]:
    """The rows a figure draws, one per graft, and a sentence saying what they are: the mean
    rows of a run of several replicates (the per-replicate values are their dots), else the
    summary as it is (and no sentence)."""
    if "n_seeds" not in summary.columns:
        return summary, None
    means = summary.filter(pl.col("n_seeds") > 1)
    if means.is_empty():
        return summary, None
    k = _int_max(means["n_seeds"])
    replicates = means["per_seed_of"][0].replace(",", ", ")
    return means, (
        f"Each bar is the mean over {k} replicates ({replicates}; d = data seed, "
        "f = finetune seed); dots: each replicate's value."
    )


def with_twins(order: list[str]) -> list[str]:
    """``order`` with each control twin (``<graft> [control]``) right after its graft."""
    names = list(dict.fromkeys(order))
    twins = {n for n in names if n.endswith(CONTROL_SUFFIX) and n[: -len(CONTROL_SUFFIX)] in names}
    out = []
    for name in names:
        if name not in twins:
            out.append(name)
            if name + CONTROL_SUFFIX in twins:
                out.append(name + CONTROL_SUFFIX)
    return out


def _join(*notes: str | None) -> str | None:
    return " ".join(n for n in notes if n) or None


def metric_slug(metric: str) -> str:
    """``acc@5`` -> ``acc5``: the metric's part of a figure's file name."""
    return "".join(c for c in metric if c.isalnum() or c == "_") or "metric"


def draw_figures(
    folder: str | Path, metric: str = "acc@5", fig_dir: str | Path | None = None
) -> list[Path]:
    """Redraw the figures of the run in ``folder`` from ``summary.parquet``; return PNG paths.
    The CSV mirrors of its tables are checked against them first (:func:`refresh_mirrors`).

    Files are ``<folder>/figures/<experiment>_<template>[_<group>]_<metric>.png`` (and
    ``.pdf``; ``fig_dir``: that folder instead, e.g. for a read-only run), so figures of
    different metrics live side by side; a lens run's bar charts
    (the model's output per graft) are ``final_layer_<template>_<metric>.png``, since
    ``lens_*`` are its lens figures (:func:`graft.study.analyses.lens.draw_lens_figures`).

    Raises:
        DamagedFileError: ``summary.parquet`` or ``config.json`` is damaged (or the summary
            does not match its digest).
        StorageError: a figure cannot be written (disk full, read-only folder).
        RunFolderError: ``folder`` holds no finished run.
    """
    folder = Path(folder)
    refuse_special_files(folder)
    summary_file = folder / "summary.parquet"
    config_file = folder / "config.json"
    if not summary_file.is_file() or not config_file.is_file():
        # (a run whose folder was removed before its figures ends here too)
        raise RunFolderError(
            f"{folder} is not a finished run folder (needs summary.parquet and config.json); "
            "give the output folder of a completed experiment, or rerun its experiment"
        )
    record = read_run_record(config_file)
    options = recorded_options(folder)
    summary = read_table(summary_file, SUMMARY_STEM, record.run_key, options=options)
    refresh_mirrors(folder, record.run_key, options)
    problem = "" if fig_dir is None else path_problem(fig_dir)
    if problem:
        raise RunFolderError(f"the figures folder {printable(fig_dir)} {problem}")
    if metric not in summary.columns:
        stats = [c for c in summary.columns if f"{c}_lo" in summary.columns]
        raise ResultsError(f"unknown metric {metric!r}; use one of {', '.join(stats)}")
    order = with_twins([g.name for g in record.grafts])
    experiment = record.experiment
    return draw_summary_figures(
        summary,
        experiment,
        record.model,
        Path(fig_dir) if fig_dir is not None else folder / "figures",
        metric,
        order,
    )


def draw_summary_figures(
    summary: pl.DataFrame,
    experiment: str,
    model: str,
    fig_dir: Path,
    metric: str = "acc@5",
    order: list[str] | None = None,
) -> list[Path]:
    """Draw the figures of one experiment's ``summary`` into ``fig_dir``; return PNG paths.

    What :func:`draw_figures` does for a run folder, for a summary table read from
    anywhere (e.g. a summary CSV committed under ``results/``). Where the paper's text
    states a number for the paper model ``model`` stands for
    (:mod:`graft.results.paper.numbers`), a bar figure draws it as a black diamond beside
    the graft's bar and a component figure's footnote states it.

    Args:
        summary: the summary table (``group``, ``template``, ``graft`` and the metric).
        experiment: the experiment that wrote it (``position``, ``component``, ...).
        model: graft's model name (the title, and which paper model it is compared with).
        fig_dir: where the PNG and PDF files go.
        metric: the metric drawn.
        order: graft names in plot order (default: as they appear in ``summary``).
    """
    summary, seeds_note = figure_rows(summary)
    if order is None:
        order = list(dict.fromkeys(summary["graft"].to_list()))
    suffix = metric_slug(metric)
    if experiment in ("layers", "component"):
        figures = _Figures(model, metric, fig_dir, suffix, seeds_note)
        draw = _draw_layers if experiment == "layers" else _draw_components
        return draw(summary, order, figures)
    out: list[Path] = []
    unit = metric == "acc@5"  # the paper's numbers are top-5 accuracies
    xlabel, legend, note = _BAR_TEXT.get(
        experiment, ("grafts", {**_BASE_LEGEND, plots.GRAFT_KEY: "graft"}, None)
    )
    summary = summary.with_columns(pl.col("group").fill_null(""))
    for (group, template), part in summary.partition_by(
        ["group", "template"], as_dict=True, maintain_order=True
    ).items():
        names = [n for n in dict.fromkeys(order) if n in set(part["graft"])]
        paper = paper_numbers.bar_values(model, experiment, template, group) if unit else {}
        fig = plots.bar_chart(
            part,
            metric,
            order=names,
            model=model,
            template=f"{template}{' ' + group if group else ''}",
            reference_labels=[n for n in names if n in _REFERENCES],
            legend_labels=legend,
            xlabel=xlabel,
            whiskers=plots.whiskers_text(part, metric),
            note=_join(
                note,
                seeds_note,
                _paper_bar_note(model, paper),
                _paper_approx_note(model, experiment, template, group, names) if unit else None,
            ),
            paper=paper,
        )
        stem = f"{_BAR_STEMS.get(experiment, experiment)}_{template}"
        stem += f"_{slug(group)}" if group else ""
        png, _ = plots.save_figure(fig, fig_dir, f"{stem}_{suffix}")
        out.append(png)
    return out


@dataclass(frozen=True)
class _Figures:
    """What every figure of one summary shares.

    Fields:
        model: graft's model name (titles; the paper model it is compared with).
        metric: the metric drawn.
        fig_dir: where the PNG and PDF files go.
        suffix: the metric's part of the file names.
        seeds_note: the footnote of a summary over several replicates (None: one).
    """

    model: str
    metric: str
    fig_dir: Path
    suffix: str
    seeds_note: str | None


def _draw_layers(summary: pl.DataFrame, order: list[str], figures: _Figures) -> list[Path]:
    """One heatmap per (component group, template); control grafts in a heatmap of their
    own (``..._control_<metric>``)."""
    control = pl.col("graft").str.ends_with(CONTROL_SUFFIX)
    out = _draw_layer_maps(summary.filter(~control), order, figures, control=False)
    twins = summary.filter(control).with_columns(pl.col("graft").str.strip_suffix(CONTROL_SUFFIX))
    if not twins.is_empty():
        main = [n for n in order if not n.endswith(CONTROL_SUFFIX)]
        out += _draw_layer_maps(twins, main, figures, control=True)
    return out


def _draw_layer_maps(
    summary: pl.DataFrame, order: list[str], figures: _Figures, *, control: bool
) -> list[Path]:
    model, metric, seeds_note = figures.model, figures.metric, figures.seeds_note
    out = []
    donor = "a control donor's" if control else "SFT"
    kind = "_control" if control else ""
    for (group, template), part in summary.partition_by(
        ["group", "template"], as_dict=True, maintain_order=True
    ).items():
        if not group:
            continue  # references
        cells = part.filter(pl.col("graft").str.contains(LAYER_SEP, literal=True))
        split = (
            cells["graft"]
            .str.split_exact(LAYER_SEP, 1)
            .struct.rename_fields(["positions", "layers"])
        )
        frame = cells.with_columns(split.struct.unnest())
        row_order = list(dict.fromkeys(n.split(LAYER_SEP)[0] for n in order if LAYER_SEP in n))
        col_order = list(dict.fromkeys(n.split(LAYER_SEP)[1] for n in order if LAYER_SEP in n))
        n = _int_max(part["n"])
        whiskers = plots.whiskers_text(part, metric)
        cells_are = f"{metric} over n={n} prompts"
        if seeds_note:
            cells_are = f"mean of {metric} over {_int_max(part['n_seeds'])} replicates (n={n} each)"
        fig = plots.heatmap(
            frame,
            value=metric,
            row_order=[r for r in row_order if r in set(frame["positions"])],
            col_order=[c for c in col_order if c in set(frame["layers"])],
            title=f"{metric}: {model}, {template}, components {group}"
            f"{', control donor' if control else ''} (n={n})",
            note=f"Cells: {cells_are}, {donor} weights grafted into PRE at the row's "
            f"positions in the column's layers ({whiskers}s in summary.csv).",
        )
        stem = f"layers_{slug(group)}_{template}{kind}_{figures.suffix}"
        png, _ = plots.save_figure(fig, figures.fig_dir, stem)
        out.append(png)
    return out


def _paper_bar_note(model: str, paper: dict[str, tuple[float, str]]) -> str | None:
    """The footnote sentence of a figure with the paper's markers: whose numbers they are."""
    if not paper:
        return None
    paper_model = paper_numbers.paper_model_of(model)
    return (
        f"Diamonds: top-5 accuracy the paper's text states for {paper_model}, "
        f"a different model than {model}."
    )


def _paper_statements(
    paper_model: str, found: list[paper_numbers.PaperNumber], parts: list[str]
) -> str | None:
    """One footnote sentence for the paper's statements ``found`` (worded as ``parts``):
    ``Paper (<model>, <figures>; not this model): <part>; <part>.``"""
    if not found:
        return None
    sources = ", ".join(dict.fromkeys(n.source.split(",")[0] for n in found))
    return f"Paper ({paper_model}, {sources}; not this model): " + "; ".join(parts) + "."


def _paper_approx_note(
    model: str, experiment: str, template: str, group: str, names: list[str]
) -> str | None:
    """The paper's "≈" statements between two bars of the figure (Fig. 2: FE+LT ≈ SFT,
    (FE+LT)^C ≈ PRE; Fig. 5), as a footnote sentence: they state no number to draw."""
    paper_model = paper_numbers.paper_model_of(model)
    if paper_model is None:
        return None
    found = [
        n
        for n in paper_numbers.lookup(paper_model, experiment, template=template, kind="approx")
        if n.group == (group or "") and n.graft in names and n.versus in names
    ]
    return _paper_statements(paper_model, found, [f"{n.graft} ≈ {n.versus}" for n in found])


def _paper_component_note(model: str, template: str, metric: str) -> str | None:
    """The paper's component differences (Fig. 4) for ``model``'s paper model, as a
    footnote sentence: they are differences between bars, not bar heights."""
    paper_model = paper_numbers.paper_model_of(model)
    if paper_model is None or metric != "acc@5":
        return None
    found = paper_numbers.lookup(paper_model, "component", template=template, kind="difference")
    parts = [
        f"{n.graft} minus {n.versus} = {n.value:+.2f} in the {n.group or 'SFT'} pair" for n in found
    ]
    return _paper_statements(paper_model, found, parts)


def _draw_components(summary: pl.DataFrame, order: list[str], figures: _Figures) -> list[Path]:
    model, metric = figures.model, figures.metric
    out = []
    for template, part in summary.partition_by(
        "template", as_dict=True, maintain_order=True
    ).items():
        template = template[0] if isinstance(template, tuple) else template
        fig = plots.component_chart(
            part,
            metric,
            group="group",
            order=[n for n in dict.fromkeys(order) if n in set(part["graft"])],
            model=model,
            title=f"{metric} by component set grafted at the last token: {model}, {template}, "
            f"{plots.n_text(part, None)}",
            group_labels=PAIR_LABELS,
            legend_labels={
                "PRE": "PRE: base model alone",
                "SFT": "SFT: donor alone",
                plots.GRAFT_KEY: "base with the donor's components at LT",
            },
            whiskers=plots.whiskers_text(part, metric),
            note=_join(figures.seeds_note, _paper_component_note(model, template, metric)),
        )
        png, _ = plots.save_figure(fig, figures.fig_dir, f"component_{template}_{figures.suffix}")
        out.append(png)
    return out
