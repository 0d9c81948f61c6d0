"""Figures of graft summaries (matplotlib, headless).

Every function takes a polars frame (usually from :func:`graft.results.metrics.summarize`) and
returns a :class:`matplotlib.figure.Figure` drawn on an Agg canvas. pyplot is never used,
so nothing here changes the global backend or opens a window; :func:`save_figure` writes
PNG and PDF files.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from graft.results.folder import atomic_path

REFERENCE_LABELS = ("PRE", "SFT")
GRAFT_COLOR = "#3b6fb6"
REFERENCE_COLORS = ("#8c8c8c", "#4d4d4d", "#b3b3b3", "#666666")
# Greys are kept for the reference models: tab10's 7, tab20's light grey 15.
_TAB10_GREY, _TAB20_LIGHT_GREY = 7, 15


def _graft_palette() -> list:
    """18 distinct non-grey colours: tab10's strong ones, then tab20's light ones (odd indices)."""
    tab10, tab20 = colormaps["tab10"], colormaps["tab20"]
    strong = [tab10(i) for i in range(10) if i != _TAB10_GREY]
    light = [tab20(i) for i in range(1, 20, 2) if i != _TAB20_LIGHT_GREY]
    return strong + light


_ALL_ALL = re.compile(r"^\s*([^:;@]+?)\s*:\s*all\s*:\s*all\s*(@sft)?\s*$")


def graft_label(name: str) -> str:
    """A readable axis label for a graft name or spec text.

    ``"FE+LT:all:all"`` -> ``"FE+LT"``, ``"none"`` -> ``"PRE"``, and a complement ``^C``
    is typeset as a superscript: ``"(FE+LT)^C"`` -> ``(FE+LT)`` with superscript C.
    """
    text = str(name).strip()
    if text.lower() == "none":
        return "PRE"
    match = _ALL_ALL.match(text)
    if match:
        text = match.group(1)
    text = text.replace("$", r"\$")
    return text.replace("^C", "$^{C}$")


def _new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _value_format(metric: str) -> str:
    if "rank" in metric:
        return "{:.1f}"
    if metric.startswith(("acc", "hit")) or "prob" in metric:
        return "{:.2f}"
    return "{:.3g}"


def _is_unit_metric(metric: str) -> bool:
    return metric.startswith(("acc", "hit")) or "prob" in metric


def _require(frame: pl.DataFrame, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{what}: columns {missing} missing (have {frame.columns})")


def _error_bars(frame: pl.DataFrame, metric: str) -> np.ndarray | None:
    """``[2, rows]`` distances below/above each value, or None without CI columns."""
    lo_col, hi_col = f"{metric}_lo", f"{metric}_hi"
    if lo_col not in frame.columns or hi_col not in frame.columns:
        return None
    value = frame[metric].cast(pl.Float64).to_numpy()
    lo = frame[lo_col].cast(pl.Float64).to_numpy()
    hi = frame[hi_col].cast(pl.Float64).to_numpy()
    err = np.vstack([value - lo, hi - value])
    return np.clip(np.nan_to_num(err, nan=0.0), 0.0, None)


def n_text(frame: pl.DataFrame, n: int | str | None) -> str | None:
    if n is not None:
        return f"n={n}"
    if "n" not in frame.columns or frame.is_empty():
        return None
    lo, hi = frame["n"].min(), frame["n"].max()
    text = f"n={lo}" if lo == hi else f"n={lo}\u2013{hi}"
    if "n_dropped" in frame.columns:
        dropped = frame["n_dropped"].max()
        if dropped:
            text += f" ({dropped} dropped)"
    return text


def _title(
    title: str | None, metric: str, model: str | None, template: str | None, n_text: str | None
) -> str:
    if title is not None:
        return title
    parts = [f"model: {model}" if model else None, f"template: {template}" if template else None]
    details = ", ".join(p for p in [*parts, n_text] if p)
    return f"{metric}" + (f" \u2014 {details}" if details else "")


def _ordered(values: Sequence[Any], order: Sequence[Any] | None, what: str) -> list[Any]:
    present = list(dict.fromkeys(values))
    if order is None:
        return present
    unknown = [o for o in order if o not in present]
    if unknown:
        raise ValueError(f"{what} {unknown} not in the frame (have {present})")
    return list(order)


def _annotate_bars(
    ax: Any, xs: Sequence[float], tops: Sequence[float], texts: Sequence[str], **kw: Any
) -> None:
    lo, hi = ax.get_ylim()
    pad = 0.01 * (hi - lo)
    for x, top, text in zip(xs, tops, texts, strict=True):
        if math.isfinite(top):
            ax.text(x, top + pad, text, ha="center", va="bottom", **kw)


def metric_label(metric: str) -> str:
    """Axis label of ``metric``, saying which direction is better for ranks."""
    return f"{metric} (lower is better)" if "rank" in metric else metric


def caption(metric: str, n_text: str | None, whiskers: str | None, note: str | None = None) -> str:
    """The footnote of a bar figure: what a bar and a whisker are (and ``note``)."""
    bars = f"Bars: {metric}" + (f" over {n_text} prompts each" if n_text else "")
    parts = [bars, f"whiskers: {whiskers}" if whiskers else "no confidence intervals"]
    return "; ".join(parts) + "." + (f" {note}" if note else "")


def _reference_color(name: str, reference_labels: Sequence[str]) -> str:
    return REFERENCE_COLORS[list(reference_labels).index(name) % len(REFERENCE_COLORS)]


def _legend_handles(
    names: Sequence[str],
    reference_labels: Sequence[str],
    legend_labels: Mapping[str, str] | None,
    graft_color: Any = GRAFT_COLOR,
) -> list:
    """One patch per colour the bars use: each reference in its grey, then the grafts."""
    from matplotlib.patches import Patch

    legend_labels = legend_labels or {}
    handles = [
        Patch(
            facecolor=_reference_color(r, reference_labels),
            edgecolor="black",
            linewidth=0.5,
            label=legend_labels.get(r, r),
        )
        for r in reference_labels
        if r in names
    ]
    if any(name not in reference_labels for name in names):
        handles.append(
            Patch(
                facecolor=graft_color,
                edgecolor="black",
                linewidth=0.5,
                label=legend_labels.get(GRAFT_KEY, "graft"),
            )
        )
    return handles


#: Key of ``legend_labels`` for the graft bars (the others are reference names).
GRAFT_KEY = "graft"
#: What the whiskers of the summaries' ``_lo``/``_hi`` columns are (graft.results.metrics.summarize).
DEFAULT_WHISKERS = "95% bootstrap CI"


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
) -> Figure:
    """One bar per graft, like the paper's Fig. 2.

    Args:
        summary: one row per graft (e.g. from :func:`graft.results.metrics.summarize` filtered to
            one template); needs columns ``x`` and ``metric``; ``<metric>_lo`` and
            ``<metric>_hi`` give error bars when present, ``n`` / ``n_dropped`` the title's n.
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

    Raises:
        ValueError: on missing columns, unknown names in ``order`` or several rows per graft.
    """
    _require(summary, [x, metric], "bar_chart")
    if summary[x].n_unique() != summary.height:
        raise ValueError(
            f"bar_chart: several rows per {x!r}; filter to one template/model first "
            "or use component_chart"
        )
    names = summary[x].to_list()
    if order is None:
        refs = [r for r in reference_labels if r in names]
        order = refs + [g for g in names if g not in refs]
    order = _ordered(names, order, "bar_chart: order names")
    rows = pl.DataFrame({x: order}, schema={x: summary.schema[x]}).join(
        summary, on=x, how="left", maintain_order="left"
    )
    values = rows[metric].cast(pl.Float64).to_numpy()
    err = _error_bars(rows, metric)
    colors = [
        _reference_color(name, reference_labels) if name in reference_labels else GRAFT_COLOR
        for name in order
    ]
    labels = labels or {}
    ticks = [labels.get(name, graft_label(name)) for name in order]

    fig = _new_figure(max(5.0, 0.75 * len(order) + 3.0), 4.2)
    ax = fig.add_subplot()
    xs = np.arange(len(order))
    ax.bar(
        xs,
        values,
        color=colors,
        edgecolor="black",
        linewidth=0.5,
        yerr=err,
        capsize=3,
        error_kw={"elinewidth": 0.8},
    )
    tops = values if err is None else values + err[1]
    if _is_unit_metric(metric):
        ax.set_ylim(0, 1.12)
    elif np.isfinite(tops).any():
        ax.set_ylim(0, 1.12 * float(np.nanmax(tops)) or 1.0)
    fmt = _value_format(metric)
    _annotate_bars(
        ax, xs, tops, [fmt.format(v) if math.isfinite(v) else "" for v in values], fontsize=8
    )
    long_ticks = max(map(len, ticks), default=0) > 6
    ax.set_xticks(
        xs, ticks, rotation=30 if long_ticks else 0, ha="right" if long_ticks else "center"
    )
    ax.set_ylabel(metric_label(metric))
    ax.set_xlabel(xlabel or ("grafted positions" if x == "graft" else x))
    ax.legend(
        handles=_legend_handles(order, reference_labels, legend_labels),
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
        frameon=False,
    )
    ax.spines[["top", "right"]].set_visible(False)
    n_label = n_text(summary, n)
    ax.set_title(_title(title, metric, model, template, n_label), fontsize=10)
    fig.supxlabel(
        caption(metric, n_label, whiskers if err is not None else None, note),
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
        ValueError: on missing columns, unknown names or duplicate (group, set) rows.
    """
    if group is None:
        summary = summary.with_columns(pl.lit("").alias("__group"))
        group = "__group"
    _require(summary, [x, group, metric], "component_chart")
    if summary.select(x, group).is_duplicated().any():
        raise ValueError(f"component_chart: several rows for one ({group!r}, {x!r}) pair")
    names = summary[x].to_list()
    if order is None:
        refs = [r for r in reference_labels if r in names]
        order = refs + [s for s in dict.fromkeys(names) if s not in refs]
    sets = _ordered(names, order, "component_chart: order names")
    groups = _ordered(summary[group].to_list(), group_order, "component_chart: group values")
    labels, group_labels = labels or {}, group_labels or {}
    ticks = [labels.get(name, graft_label(name)) for name in sets]
    colors = [
        _reference_color(name, reference_labels) if name in reference_labels else GRAFT_COLOR
        for name in sets
    ]

    ncols = min(len(groups), 3)
    nrows = math.ceil(len(groups) / ncols)
    fig = _new_figure(width, nrows * (0.26 * len(sets) + 1.0) + 1.2)
    axes = fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False).ravel()
    fmt = _value_format(metric)
    ys = np.arange(len(sets))
    limit = 0.0
    for ax, value in zip(axes, groups, strict=False):
        rows = pl.DataFrame({x: sets}, schema={x: summary.schema[x]}).join(
            summary.filter(pl.col(group) == value), on=x, how="left", maintain_order="left"
        )
        values = rows[metric].cast(pl.Float64).to_numpy()
        err = _error_bars(rows, metric)
        ax.barh(
            ys,
            values,
            color=colors,
            edgecolor="black",
            linewidth=0.4,
            xerr=err,
            capsize=2,
            error_kw={"elinewidth": 0.7},
        )
        ends = values if err is None else values + err[1]
        for y, end, v in zip(ys, ends, values, strict=True):
            if math.isfinite(v):
                ax.text(end, y, " " + fmt.format(v), va="center", ha="left", fontsize=7)
        if np.isfinite(ends).any():
            limit = max(limit, float(np.nanmax(ends)))
        if group != "__group":
            ax.set_title(group_labels.get(value, str(value)), fontsize=9)
        ax.spines[["top", "right"]].set_visible(False)
        ax.set_xlabel(metric_label(metric), fontsize=8)
    for ax in axes[len(groups) :]:
        ax.set_visible(False)
    axes[0].set_yticks(ys, ticks, fontsize=8)
    axes[0].invert_yaxis()  # first set on top
    if _is_unit_metric(metric):
        axes[0].set_xlim(0, 1.2)
        axes[0].set_xticks([0, 0.25, 0.5, 0.75, 1.0])
    else:
        axes[0].set_xlim(0, 1.25 * limit or 1.0)
    n_label = n_text(summary, n)
    fig.suptitle(_title(title, metric, model, None, n_label), fontsize=10)
    has_ci = f"{metric}_lo" in summary.columns and f"{metric}_hi" in summary.columns
    # the footnote heads the legend below the panels (a separate supxlabel would collide)
    fig.legend(
        handles=_legend_handles(sets, reference_labels, legend_labels),
        loc="outside lower center",
        ncols=4,
        fontsize=8,
        frameon=False,
        title=caption(metric, n_label, whiskers if has_ci else None, note),
        title_fontsize=7.5,
    )
    return fig


def heatmap(
    frame: pl.DataFrame,
    row: str = "positions",
    col: str = "layers",
    value: str = "acc@5",
    *,
    row_order: Sequence[Any] | None = None,
    col_order: Sequence[Any] | None = None,
    title: str | None = None,
    cmap: str = "viridis",
    vmin: float | None = None,
    vmax: float | None = None,
    fmt: str | None = None,
    row_labels: Mapping[Any, str] | None = None,
    note: str | None = None,
) -> Figure:
    """Annotated heatmap of ``value`` over ``row`` x ``col`` (layer localisation, E7).

    Args:
        frame: one row per (row, col) cell; missing cells are drawn grey.
        row, col, value: the columns for the y axis, the x axis and the colour.
        row_order, col_order: axis orders (default: order of appearance).
        title: the title (default: ``value``).
        cmap: a matplotlib colormap name.
        vmin, vmax: colour limits (default 0..1 for accuracies and probabilities, else
            the data range).
        fmt: cell text format (default by metric, e.g. ``"{:.2f}"``).
        row_labels: row value -> label (default :func:`graft_label` of the value).
        note: a footnote (e.g. what a cell is and where its confidence interval is).

    Raises:
        ValueError: on missing columns, unknown order values or duplicate cells.
    """
    _require(frame, [row, col, value], "heatmap")
    if frame.select(row, col).is_duplicated().any():
        raise ValueError(f"heatmap: several rows for one ({row!r}, {col!r}) cell; aggregate first")
    rows = _ordered(frame[row].to_list(), row_order, "heatmap: row values")
    cols = _ordered(frame[col].to_list(), col_order, "heatmap: column values")
    r_index = {v: i for i, v in enumerate(rows)}
    c_index = {v: j for j, v in enumerate(cols)}
    grid = np.full((len(rows), len(cols)), np.nan)
    for r, c, v in frame.select(row, col, pl.col(value).cast(pl.Float64)).iter_rows():
        if r in r_index and c in c_index and v is not None:
            grid[r_index[r], c_index[c]] = v
    if _is_unit_metric(value):
        vmin = 0.0 if vmin is None else vmin
        vmax = 1.0 if vmax is None else vmax
    finite = grid[np.isfinite(grid)]
    if vmin is None:
        vmin = float(finite.min()) if finite.size else 0.0
    if vmax is None:
        vmax = float(finite.max()) if finite.size else 1.0
    if vmax <= vmin:
        vmax = vmin + 1.0

    colormap = colormaps[cmap].with_extremes(bad="#d9d9d9")
    norm = Normalize(vmin=vmin, vmax=vmax)
    fig = _new_figure(max(4.0, 0.65 * len(cols) + 2.5), max(2.5, 0.45 * len(rows) + 1.5))
    ax = fig.add_subplot()
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=colormap, norm=norm, aspect="auto")
    fmt = fmt or _value_format(value)
    small = len(cols) > 12
    for i in range(len(rows)):
        for j in range(len(cols)):
            v = grid[i, j]
            if not math.isfinite(v):
                continue
            red, green, blue, _ = colormap(norm(v))
            dark = 0.299 * red + 0.587 * green + 0.114 * blue < 0.5
            ax.text(
                j,
                i,
                fmt.format(v),
                ha="center",
                va="center",
                fontsize=6 if small else 8,
                color="white" if dark else "black",
            )
    row_labels = row_labels or {}
    ax.set_yticks(range(len(rows)), [row_labels.get(r, graft_label(str(r))) for r in rows])
    ax.set_xticks(
        range(len(cols)),
        [str(c) for c in cols],
        rotation=45 if small or max((len(str(c)) for c in cols), default=0) > 4 else 0,
        ha="right" if small else "center",
    )
    ax.set_xlabel(col)
    ax.set_ylabel(row)
    fig.colorbar(image, ax=ax, label=metric_label(value), shrink=0.9)
    ax.set_title(title if title is not None else value, fontsize=10)
    if note:
        fig.supxlabel(note, fontsize=7.5, color="0.25")
    return fig


def save_figure(
    fig: Figure, folder: str | os.PathLike, stem: str, dpi: int = 150
) -> tuple[Path, Path]:
    """Write ``<folder>/<stem>.png`` (at ``dpi``) and ``<stem>.pdf``; return both paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in ("png", "pdf"):
        path = folder / f"{stem}.{fmt}"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=fmt, dpi=dpi)
        paths.append(path)
    return paths[0], paths[1]
