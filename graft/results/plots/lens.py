"""Logit-lens lines: a statistic of the target per layer, one line per graft, a panel per
(position, template), from a lens summary (:func:`graft.study.lens.summarize_lens`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from graft.results.plots.style import (
    REFERENCE_COLORS,
    REFERENCE_LABELS,
    graft_label,
    n_text,
    new_figure,
    ordered,
    require_columns,
    whiskers_text,
)

#: Line colours of the grafts that are not references (matplotlib's tab10 without its greys).
_GRAFT_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")


def lens_chart(
    summary: pl.DataFrame,
    metric: str = "median_rank",
    *,
    order: Sequence[str] | None = None,
    positions: Sequence[str] | None = None,
    model: str | None = None,
) -> Figure:
    """Layer on x, ``metric`` on y, one line per graft with its interval as a band; a panel
    per (position, template). A rank is drawn as rank + 1 on a log axis (1 = the target is
    the top token); a probability on a linear axis from 0 to 1.

    Args:
        summary: rows of ``template``, ``graft``, ``position``, ``layer``, ``metric``,
            ``<metric>_lo``, ``<metric>_hi`` (and ``n``).
        metric: the statistic (``median_rank``, ``mean_rank``, ``mean_prob``, ...).
        order: the grafts' order (default: as they appear; names not in ``summary`` are
            left out).
        positions: the panel rows' order (default: as they appear).
        model: the model's name, for the title.
    """
    columns = ["template", "graft", "position", "layer", metric, f"{metric}_lo", f"{metric}_hi"]
    require_columns(summary, columns, "lens_chart")
    present = set(summary["graft"])
    grafts = [g for g in (order or summary["graft"].to_list()) if g in present]
    grafts = list(dict.fromkeys(grafts))
    rows = ordered(
        summary["position"].to_list(),
        [p for p in positions if p in set(summary["position"])] if positions else None,
        "lens_chart: positions",
    )
    cols = list(dict.fromkeys(summary["template"].to_list()))
    rank = "rank" in metric
    fig = new_figure(3.6 * len(cols) + 1.6, 2.8 * len(rows) + 0.9)
    axes = np.atleast_2d(
        fig.subplots(len(rows), len(cols), sharex=True, sharey=True, squeeze=False)
    )
    for r, position in enumerate(rows):
        for c, template in enumerate(cols):
            ax = axes[r, c]
            panel = summary.filter(
                (pl.col("position") == position) & (pl.col("template") == template)
            )
            for k, name in enumerate(grafts):
                _draw_line(ax, panel.filter(pl.col("graft") == name).sort("layer"), metric, name, k)
            ax.set_title(f"{template}, at {position} ({n_text(panel, None) or 'n=?'})", fontsize=9)
            if rank:
                ax.set_yscale("log")
            else:
                ax.set_ylim(-0.02, 1.02)
            ax.grid(True, which="major", alpha=0.3)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            if r == len(rows) - 1:
                ax.set_xlabel("layer (output of)")
            if c == 0:
                ax.set_ylabel(f"{metric} + 1 (log)" if rank else metric)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize=8, frameon=False)
    fig.suptitle(
        f"Logit lens of the target: {metric}" + (f", {model}" if model else ""), fontsize=10
    )
    fig.supxlabel(
        f"Lines: {metric} over prompts; bands: {whiskers_text(summary, metric)}. Each layer's "
        "output decoded through the graft's final norm and unembedding.",
        fontsize=7,
    )
    return fig


def _draw_line(ax, part: pl.DataFrame, metric: str, name: str, k: int) -> None:
    """One graft's line and band (rank + 1 for ranks); references grey and dashed."""
    if part.is_empty():
        return
    shift = 1.0 if "rank" in metric else 0.0
    x = part["layer"].to_numpy()
    y, lo, hi = (
        part[c].cast(pl.Float64).to_numpy() + shift
        for c in (metric, f"{metric}_lo", f"{metric}_hi")
    )
    if name in REFERENCE_LABELS:
        color = REFERENCE_COLORS[REFERENCE_LABELS.index(name)]
        style = "--"
    else:
        color, style = _GRAFT_COLORS[k % len(_GRAFT_COLORS)], "-"
    ax.plot(x, y, style, color=color, label=graft_label(name), linewidth=1.4)
    ax.fill_between(x, lo, hi, color=color, alpha=0.1, linewidth=0)
