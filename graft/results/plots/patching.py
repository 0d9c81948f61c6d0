"""Layer x position maps of a patching sweep, as causal-tracing figures draw them (a panel per
kind of site and method), and the same values as lines per position unit."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence

import numpy as np
import polars as pl
from matplotlib.figure import Figure

from graft.results.plots.style import graft_label, new_figure, require_columns

#: What a sweep table's value columns mean, for colour bars and axes.
VALUE_LABELS = {
    "effect": "effect (0 = running model, 1 = giving model; mean target log-prob)",
    "acc@5": "top-5 accuracy",
}
_METHOD_COLORS = {"weights": "#3b6fb6", "patching": "#d1553b"}


def _titled(fig: Figure, title: str, model: str | None, note: str | None) -> Figure:
    """``fig`` with its title (and the model's name) on top and ``note`` under it."""
    fig.suptitle(f"{title} ({model})" if model else title, fontsize=10)
    if note:
        width = max(70, int(16 * fig.get_figwidth()))
        fig.supxlabel(textwrap.fill(note, width), fontsize=7.5, color="0.25")
    return fig


def _units(table: pl.DataFrame, units: Sequence[str] | None) -> list[str]:
    present = list(dict.fromkeys(table["unit"].to_list()))
    return [u for u in units if u in present] if units else present


def patching_maps(
    table: pl.DataFrame,
    direction: str,
    value: str = "effect",
    *,
    kinds: Sequence[str] = ("residual", "attn", "mlp"),
    methods: Sequence[str] = ("weights", "patching"),
    units: Sequence[str] | None = None,
    unit_labels: Mapping[str, str] | None = None,
    model: str | None = None,
    note: str | None = None,
) -> Figure:
    """One heatmap per (kind, method) of ``direction``'s sweep: layer on x, position unit on y,
    ``value`` as colour on one shared scale (0..1 for accuracies; for effects the data's
    range, at least 0..1), with its colour bar.

    Args:
        table: a sweep table (:func:`graft.study.analyses.patching_report.sweep_table`): ``direction``,
            ``kind``, ``unit``, ``layer``, ``method`` and ``value``; whole-depth rows (no
            layer) are left out.
        direction: ``restore`` or ``break``.
        value: the column drawn.
        kinds, methods, units: the panel rows, columns and y-axis order (those present).
        unit_labels: y tick labels per unit (default the unit's text).
        model: the model's name, for the title.
        note: a caption under the figure.
    """
    require_columns(table, ["direction", "kind", "unit", "layer", "method", value], "maps")
    data = table.filter((pl.col("direction") == direction) & pl.col("layer").is_not_null())
    kinds = [k for k in kinds if k in set(data["kind"])]
    methods = [m for m in methods if m in set(data["method"])]
    order = _units(data, units)
    layers = sorted(set(data["layer"].to_list()))
    vals = data[value].to_numpy()
    unit_metric = value.startswith("acc")
    vmin = 0.0 if unit_metric else min(0.0, float(np.nanmin(vals)))
    vmax = 1.0 if unit_metric else max(1.0, float(np.nanmax(vals)))
    fig = new_figure(3.2 * len(methods) + 1.6, 1.0 + 0.32 * len(order) * len(kinds) + 0.6)
    axes = fig.subplots(len(kinds), len(methods), squeeze=False, sharex=True, sharey=True)
    image = None
    for i, kind in enumerate(kinds):
        for j, method in enumerate(methods):
            ax = axes[i][j]
            grid = np.full((len(order), len(layers)), np.nan)
            part = data.filter((pl.col("kind") == kind) & (pl.col("method") == method))
            copies = []  # cells whose patch copies the donor's whole stream: marked
            for row in part.iter_rows(named=True):
                if row["unit"] in order:
                    at = (order.index(row["unit"]), layers.index(row["layer"]))
                    grid[at] = row[value]
                    if (row.get("sanity") or 0) > 0:
                        copies.append(at)
            image = ax.imshow(
                grid, aspect="auto", cmap="viridis", vmin=vmin, vmax=vmax, interpolation="none"
            )
            for y, x in copies:
                ax.text(x, y, "=", ha="center", va="center", color="white", fontsize=8)
            ax.set_yticks(range(len(order)))
            ax.set_yticklabels([graft_label((unit_labels or {}).get(u, u)) for u in order])
            step = max(1, len(layers) // 8)
            ax.set_xticks(range(0, len(layers), step))
            ax.set_xticklabels([str(layers[k]) for k in range(0, len(layers), step)])
            ax.set_title(f"{kind}, {method}", fontsize=9)
            if i == len(kinds) - 1:
                ax.set_xlabel("layer (window centre)")
    if image is not None:
        bar = fig.colorbar(image, ax=axes, shrink=0.8)
        bar.set_label(VALUE_LABELS.get(value, value), fontsize=8)
    return _titled(fig, f"{direction}: weights vs patching, layer by layer", model, note)


def patching_lines(
    table: pl.DataFrame,
    direction: str,
    value: str = "effect",
    *,
    kinds: Sequence[str] = ("residual", "attn", "mlp"),
    units: Sequence[str] | None = None,
    unit_labels: Mapping[str, str] | None = None,
    model: str | None = None,
    note: str | None = None,
) -> Figure:
    """``value`` against the layer, one line per method with its 95% interval as a band; a
    panel per (position unit, kind) of ``direction``'s sweep."""
    require_columns(table, ["direction", "kind", "unit", "layer", "method", value], "lines")
    data = table.filter((pl.col("direction") == direction) & pl.col("layer").is_not_null())
    kinds = [k for k in kinds if k in set(data["kind"])]
    order = _units(data, units)
    fig = new_figure(3.0 * len(kinds) + 0.6, 1.9 * len(order) + 0.8)
    axes = fig.subplots(len(order), len(kinds), squeeze=False, sharex=True, sharey=True)
    for i, unit in enumerate(order):
        for j, kind in enumerate(kinds):
            ax = axes[i][j]
            part = data.filter((pl.col("unit") == unit) & (pl.col("kind") == kind))
            for method in ("weights", "patching"):
                line = part.filter(pl.col("method") == method).sort("layer")
                if line.is_empty():
                    continue
                x = line["layer"].to_numpy()
                color = _METHOD_COLORS[method]
                ax.plot(x, line[value].to_numpy(), color=color, lw=1.4, label=method)
                if f"{value}_lo" in line.columns:
                    ax.fill_between(
                        x,
                        line[f"{value}_lo"].to_numpy(),
                        line[f"{value}_hi"].to_numpy(),
                        color=color,
                        alpha=0.18,
                        lw=0,
                    )
            ax.axhline(0, color="#999999", lw=0.6)
            ax.axhline(1, color="#999999", lw=0.6, ls=":")
            label = graft_label((unit_labels or {}).get(unit, unit))
            ax.set_title(f"{label}, {kind}", fontsize=9)
            if i == len(order) - 1:
                ax.set_xlabel("layer")
    axes[0][0].legend(fontsize=8, loc="upper left")
    fig.supylabel(VALUE_LABELS.get(value, value), fontsize=8)
    return _titled(fig, f"{direction}: weights vs patching per layer", model, note)
