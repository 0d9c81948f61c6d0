"""Annotated heatmaps of one value over two axes (layer localisation: positions x layers)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl
from matplotlib import colormaps
from matplotlib.colors import Colormap, Normalize
from matplotlib.figure import Figure

from graft.errors import ResultsError
from graft.results.plots.style import (
    graft_label,
    is_unit_metric,
    metric_label,
    new_figure,
    ordered,
    require_columns,
    value_format,
)


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
        ResultsError: on missing columns, unknown order values or duplicate cells.
    """
    require_columns(frame, [row, col, value], "heatmap")
    if frame.select(row, col).is_duplicated().any():
        raise ResultsError(
            f"heatmap: several rows for one ({row!r}, {col!r}) cell; aggregate first"
        )
    rows = ordered(frame[row].to_list(), row_order, "heatmap: row values")
    cols = ordered(frame[col].to_list(), col_order, "heatmap: column values")
    grid = _grid(frame, row, col, value, rows, cols)
    colormap = colormaps[cmap].with_extremes(bad="#d9d9d9")
    norm = Normalize(*_color_limits(grid, value, vmin, vmax))
    fig = new_figure(max(4.0, 0.65 * len(cols) + 2.5), max(2.5, 0.45 * len(rows) + 1.5))
    ax = fig.add_subplot()
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=colormap, norm=norm, aspect="auto")
    small = len(cols) > 12
    _annotate_cells(ax, grid, colormap, norm, fmt or value_format(value), 6 if small else 8)
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


def _grid(
    frame: pl.DataFrame, row: str, col: str, value: str, rows: list[Any], cols: list[Any]
) -> np.ndarray:
    """``value`` as a ``[rows, cols]`` array, NaN where ``frame`` has no cell."""
    r_index = {v: i for i, v in enumerate(rows)}
    c_index = {v: j for j, v in enumerate(cols)}
    grid = np.full((len(rows), len(cols)), np.nan)
    for r, c, v in frame.select(row, col, pl.col(value).cast(pl.Float64)).iter_rows():
        if r in r_index and c in c_index and v is not None:
            grid[r_index[r], c_index[c]] = v
    return grid


def _color_limits(
    grid: np.ndarray, value: str, vmin: float | None, vmax: float | None
) -> tuple[float, float]:
    """``(vmin, vmax)``: as given, else 0..1 for unit metrics, else the data range."""
    if is_unit_metric(value):
        vmin = 0.0 if vmin is None else vmin
        vmax = 1.0 if vmax is None else vmax
    finite = grid[np.isfinite(grid)]
    if vmin is None:
        vmin = float(finite.min()) if finite.size else 0.0
    if vmax is None:
        vmax = float(finite.max()) if finite.size else 1.0
    if vmax <= vmin:
        vmax = vmin + 1.0
    return vmin, vmax


def _annotate_cells(
    ax: Any, grid: np.ndarray, colormap: Colormap, norm: Normalize, fmt: str, fontsize: float
) -> None:
    """Write each finite cell's value, white on dark colours and black on light ones."""
    for i, j in np.ndindex(grid.shape):
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
            fontsize=fontsize,
            color="white" if dark else "black",
        )


def attribution_map(table: pl.DataFrame, metric: str = "logprob") -> Figure:
    """``graft.attribute``'s table as a map: the estimate averaged over prompts, one row per
    unit:kind, one column per layer, coloured around 0 (red: the graft raises the target)."""
    require_columns(table, ["unit", "kind", "layer", "estimate"], "attribution_map")
    mean = table.group_by("unit", "kind", "layer", maintain_order=True).agg(
        pl.col("estimate").mean()
    )
    mean = mean.with_columns(cell=pl.format("{}:{}", "unit", "kind"))
    bound = float(np.abs(mean["estimate"].to_numpy()).max(initial=0.0)) or 1.0
    return heatmap(
        mean.select("cell", "layer", "estimate"),
        row="cell",
        col="layer",
        value="estimate",
        col_order=sorted(set(mean["layer"].to_list())),
        cmap="RdBu_r",
        vmin=-bound,
        vmax=bound,
        fmt="{:.2f}",
        title=f"estimated {metric} change per single-cell graft (mean over prompts)",
        row_labels={c: c for c in mean["cell"].to_list()},
    )
