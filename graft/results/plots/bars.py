"""Bar figures: one bar per graft (:func:`bar_chart`, the paper's Fig. 2) and one panel of
horizontal bars per donor pair or template (:func:`component_chart`, the paper's Fig. 4)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl
from matplotlib.figure import Figure

from graft.errors import ResultsError
from graft.results.plots.style import (
    DEFAULT_WHISKERS,
    REFERENCE_LABELS,
    bar_colors,
    caption,
    draw_seed_points,
    error_bars,
    graft_label,
    is_unit_metric,
    legend_handles,
    metric_label,
    n_text,
    new_figure,
    ordered,
    per_seed_values,
    require_columns,
    seed_points_handle,
    title_text,
    value_format,
    value_span,
)


def _plot_order(
    names: Sequence[str], order: Sequence[str] | None, reference_labels: Sequence[str], what: str
) -> list[str]:
    """``order`` checked against ``names``; default: references first, then as they appear."""
    if order is None:
        refs = [r for r in reference_labels if r in names]
        order = refs + [s for s in dict.fromkeys(names) if s not in refs]
    return ordered(names, order, what)


def _rows_in_order(frame: pl.DataFrame, x: str, order: Sequence[str]) -> pl.DataFrame:
    """One row of ``frame`` per name in ``order`` (nulls where ``frame`` has none)."""
    return pl.DataFrame({x: order}, schema={x: frame.schema[x]}).join(
        frame, on=x, how="left", maintain_order="left"
    )


def _draw_bars(
    ax: Any,
    positions: np.ndarray,
    values: np.ndarray,
    err: np.ndarray | None,
    colors: Sequence[str],
    *,
    horizontal: bool,
) -> np.ndarray:
    """Bars with whiskers (vertical, or horizontal in thinner lines); returns each bar's end,
    whisker included."""
    style = {
        "color": colors,
        "edgecolor": "black",
        "linewidth": 0.4 if horizontal else 0.5,
        "capsize": 2 if horizontal else 3,
        "error_kw": {"elinewidth": 0.7 if horizontal else 0.8},
    }
    if horizontal:
        ax.barh(positions, values, xerr=err, **style)
    else:
        ax.bar(positions, values, yerr=err, **style)
    return values if err is None else values + err[1]


def _annotate_bars(
    ax: Any,
    xs: Sequence[float] | np.ndarray,
    tops: Sequence[float] | np.ndarray,
    texts: Sequence[str],
    **kw: Any,
) -> None:
    lo, hi = ax.get_ylim()
    pad = 0.01 * (hi - lo)
    for x, top, text in zip(xs, tops, texts, strict=True):
        if math.isfinite(top):
            ax.text(x, top + pad, text, ha="center", va="bottom", **kw)


#: The gid of the paper's markers (tests and readers find them by it).
PAPER_GID = "paper-number"


def draw_paper_markers(
    ax: Any,
    positions: Sequence[float] | np.ndarray,
    names: Sequence[str],
    paper: Mapping[str, tuple[float, str]],
) -> list[Any]:
    """The paper's value of each named graft as a black diamond on the right half of its bar;
    returns one legend handle per distinct label."""
    from matplotlib.lines import Line2D

    style: dict[str, Any] = {"marker": "D", "color": "black", "markersize": 7, "linestyle": ""}
    style |= {"markeredgecolor": "white", "markeredgewidth": 0.8}  # visible on a dark bar
    handles: dict[str, Any] = {}
    for pos, name in zip(positions, names, strict=True):
        if name not in paper:
            continue
        value, label = paper[name]
        ax.plot([pos + 0.22], [value], zorder=4, gid=PAPER_GID, **style)
        handles.setdefault(label, Line2D([], [], label=label, **style))
    return list(handles.values())


def bar_chart(
    summary: pl.DataFrame,
    metric: str = "acc@5",
    order: Sequence[str] | None = None,
    *,
    x: str = "graft",
    title: str | None = None,
    model: str | None = None,
    template: str | None = None,
    n: int | str | None = None,
    reference_labels: Sequence[str] = REFERENCE_LABELS,
    labels: Mapping[str, str] | None = None,
    legend_labels: Mapping[str, str] | None = None,
    xlabel: str | None = None,
    whiskers: str | None = DEFAULT_WHISKERS,
    note: str | None = None,
    paper: Mapping[str, tuple[float, str]] | None = None,
) -> Figure:
    """One bar per graft, like the paper's Fig. 2.

    Args:
        summary: one row per graft (e.g. from :func:`graft.results.summary.summarize` filtered to
            one template); needs columns ``x`` and ``metric``; ``<metric>_lo`` and
            ``<metric>_hi`` give error bars when present, ``n`` / ``n_dropped`` the title's n,
            ``<metric>_per_seed`` (a mean over replicates) a dot per replicate on each bar.
        metric: the column to plot.
        order: graft names in plot order (default: references first, then as they appear).
        x: the column naming the graft.
        title: full title; default: metric, model, template and n.
        model, template: shown in the default title.
        n: shown in the default title (default: from the ``n`` column).
        reference_labels: graft names drawn as reference bars (one grey each) rather than
            grafts.
        labels: graft name -> axis label (default :func:`graft_label`).
        legend_labels: reference name (or :data:`GRAFT_KEY` for the graft bars) -> legend
            text (default: the name, and "graft").
        xlabel: the x-axis label (default "grafted positions").
        whiskers: what the error bars are, for the footnote (None: no CI columns).
        note: an extra sentence for the footnote (e.g. which weights go where).
        paper: graft name -> (the paper's value, legend text such as "paper
            (Gemma-1.1-2B, Fig. 2)"), drawn as a black diamond beside that graft's bar
            (:func:`graft.results.paper.numbers.bar_values`); names not plotted are ignored.

    Raises:
        ResultsError: on missing columns, unknown names in ``order`` or several rows per graft.
    """
    require_columns(summary, [x, metric], "bar_chart")
    if summary[x].n_unique() != summary.height:
        raise ResultsError(
            f"bar_chart: several rows per {x!r}; filter to one template/model first "
            "or use component_chart"
        )
    order = _plot_order(summary[x].to_list(), order, reference_labels, "bar_chart: order names")
    rows = _rows_in_order(summary, x, order)
    values = rows[metric].cast(pl.Float64).to_numpy()
    err = error_bars(rows, metric)
    labels = labels or {}
    ticks = [labels.get(name, graft_label(name)) for name in order]

    fig = new_figure(max(5.0, 0.75 * len(order) + 3.0), 4.2)
    ax = fig.add_subplot()
    xs = np.arange(len(order))
    tops = _draw_bars(ax, xs, values, err, bar_colors(order, reference_labels), horizontal=False)
    points = per_seed_values(rows, metric)
    if points is not None:
        draw_seed_points(ax, xs, points, horizontal=False)
    if is_unit_metric(metric):
        ax.set_ylim(0, 1.12)
    else:
        ax.set_ylim(*value_span(rows, metric, 1.12, points))
    fmt = value_format(metric)
    _annotate_bars(
        ax, xs, tops, [fmt.format(v) if math.isfinite(v) else "" for v in values], fontsize=8
    )
    long_ticks = max(map(len, ticks), default=0) > 6
    ax.set_xticks(
        xs, ticks, rotation=30 if long_ticks else 0, ha="right" if long_ticks else "center"
    )
    ax.set_ylabel(metric_label(metric))
    ax.set_xlabel(xlabel or ("grafted positions" if x == "graft" else x))
    handles = legend_handles(order, reference_labels, legend_labels)
    handles += draw_paper_markers(ax, xs, order, paper or {})
    ax.legend(
        handles=handles + ([seed_points_handle()] if points is not None else []),
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
        frameon=False,
    )
    ax.spines[["top", "right"]].set_visible(False)
    n_label = n_text(summary, n)
    ax.set_title(title_text(title, metric, model, template, n_label), fontsize=10)
    fig.supxlabel(
        caption(metric, n_label, whiskers if err is not None else None, note, fig.get_figwidth()),
        fontsize=7.5,
        color="0.25",
    )
    return fig


def component_chart(
    summary: pl.DataFrame,
    metric: str = "acc@5",
    *,
    x: str = "graft",
    group: str | None = "template",
    order: Sequence[str] | None = None,
    group_order: Sequence[Any] | None = None,
    title: str | None = None,
    model: str | None = None,
    n: int | str | None = None,
    reference_labels: Sequence[str] = REFERENCE_LABELS,
    labels: Mapping[str, str] | None = None,
    group_labels: Mapping[Any, str] | None = None,
    legend_labels: Mapping[str, str] | None = None,
    whiskers: str | None = DEFAULT_WHISKERS,
    note: str | None = None,
    width: float = 7.0,
) -> Figure:
    """One panel per ``group`` value (donor pair, template), one horizontal bar per component
    set (the ``x`` column), as the paper's Fig. 4 but readable at page width: set names on
    the y axis, values beside the bars, nothing rotated.

    Args:
        summary: one row per (group, component set); columns ``x``, ``group`` and
            ``metric``, optionally ``<metric>_lo`` / ``<metric>_hi`` and ``n``.
        metric: the column to plot.
        x: the column naming the component set.
        group: the column defining the panels (None: a single panel).
        order: component sets from top to bottom (default: references first, then as they
            appear).
        group_order: group values in panel order (default: as they appear).
        title, model, n: as in :func:`bar_chart` (the title shows n).
        reference_labels: component-set names drawn in grey (e.g. the PRE/SFT baselines).
        labels: component-set name -> axis label (default :func:`graft_label`).
        group_labels: group value -> panel title (default: the value).
        legend_labels, whiskers, note: as in :func:`bar_chart`.
        width: figure width in inches (7: a page).

    Raises:
        ResultsError: on missing columns, unknown names or duplicate (group, set) rows.
    """
    if group is None:
        summary = summary.with_columns(pl.lit("").alias("__group"))
        group = "__group"
    require_columns(summary, [x, group, metric], "component_chart")
    if summary.select(x, group).is_duplicated().any():
        raise ResultsError(f"component_chart: several rows for one ({group!r}, {x!r}) pair")
    sets = _plot_order(
        summary[x].to_list(), order, reference_labels, "component_chart: order names"
    )
    groups = ordered(summary[group].to_list(), group_order, "component_chart: group values")
    labels, group_labels = labels or {}, group_labels or {}
    colors = bar_colors(sets, reference_labels)

    ncols = min(len(groups), 3)
    nrows = math.ceil(len(groups) / ncols)
    fig = new_figure(width, nrows * (0.26 * len(sets) + 1.0) + 1.2)
    axes = fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False).ravel()
    for ax, value in zip(axes, groups, strict=False):
        rows = _rows_in_order(summary.filter(pl.col(group) == value), x, sets)
        _draw_panel(ax, rows, metric, colors)
        if group != "__group":
            ax.set_title(group_labels.get(value, str(value)), fontsize=9)
    for ax in axes[len(groups) :]:
        ax.set_visible(False)
    ys = np.arange(len(sets))
    axes[0].set_yticks(ys, [labels.get(name, graft_label(name)) for name in sets], fontsize=8)
    axes[0].invert_yaxis()  # first set on top
    if is_unit_metric(metric):
        axes[0].set_xlim(0, 1.2)
        axes[0].set_xticks([0, 0.25, 0.5, 0.75, 1.0])
    else:
        axes[0].set_xlim(*value_span(summary, metric, 1.25, per_seed_values(summary, metric)))
    n_label = n_text(summary, n)
    fig.suptitle(title_text(title, metric, model, None, n_label), fontsize=10)
    has_ci = f"{metric}_lo" in summary.columns and f"{metric}_hi" in summary.columns
    # the footnote heads the legend below the panels (a separate supxlabel would collide)
    dots = [seed_points_handle()] if per_seed_values(summary, metric) is not None else []
    handles = legend_handles(sets, reference_labels, legend_labels) + dots
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncols=len(handles) if len(handles) <= 3 else 2,
        fontsize=8,
        frameon=False,
        title=caption(metric, n_label, whiskers if has_ci else None, note, width),
        title_fontsize=7.5,
    )
    return fig


def _draw_panel(ax: Any, rows: pl.DataFrame, metric: str, colors: Sequence[str]) -> None:
    """One panel of :func:`component_chart`: a horizontal bar per row with its value beside
    its outer end (left of a negative bar, e.g. a mean log-prob)."""
    values = rows[metric].cast(pl.Float64).to_numpy()
    ys = np.arange(rows.height)
    err = error_bars(rows, metric)
    ends = _draw_bars(ax, ys, values, err, colors, horizontal=True)
    points = per_seed_values(rows, metric)
    if points is not None:
        draw_seed_points(ax, ys, points, horizontal=True)
    starts = values if err is None else values - err[0]
    fmt = value_format(metric)
    for y, start, end, v in zip(ys, starts, ends, values, strict=True):
        if math.isfinite(v) and v < 0:
            ax.text(start, y, fmt.format(v) + " ", va="center", ha="right", fontsize=7)
        elif math.isfinite(v):
            ax.text(end, y, " " + fmt.format(v), va="center", ha="left", fontsize=7)
    ax.spines[["top", "right"]].set_visible(False)
    ax.set_xlabel(metric_label(metric), fontsize=8)
