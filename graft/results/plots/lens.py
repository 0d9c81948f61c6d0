"""Logit-lens lines: a statistic of the target per layer, one line per graft, a panel per
(position, template), from a lens summary
(:func:`graft.study.analyses.lens_tables.summarize_lens`).

The layers are the embeddings (:data:`EMBEDDING_LAYER` = -1, labelled ``emb``: the stream
before the first layer) and the output of each layer (0, 1, ...). A graft whose line at a
position is an earlier graft's by causality (the summary's ``same_as`` column) is drawn once:
the panel's title and the legend name it.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import numpy as np
import polars as pl
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

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

#: The layer of the embeddings (the residual stream before the first layer) in lens tables.
EMBEDDING_LAYER = -1
#: Its label in tables and on figures.
EMBEDDING_LABEL = "emb"
#: Line colours of the grafts that are not references (matplotlib's tab10 without its greys).
_GRAFT_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")
_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "<", ">")
#: y-axis labels of the statistics a lens figure draws.
_AXIS_LABELS = {
    "median_rank": "median target rank + 1 (log; 1 = top token)",
    "mean_rank": "mean target rank + 1 (log; 1 = top token)",
    "mean_logprob": "mean log p(target), nats (0 = certain)",
    "mean_prob": "mean p(target)",
}


def layer_label(layer: int) -> str:
    """``emb`` for the embedding layer (-1), else the layer's number."""
    return EMBEDDING_LABEL if layer == EMBEDDING_LAYER else str(layer)


def lens_chart(
    summary: pl.DataFrame,
    metric: str = "median_rank",
    *,
    order: Sequence[str] | None = None,
    positions: Sequence[str] | None = None,
    model: str | None = None,
) -> Figure:
    """Layer on x (``emb``, then each layer's output), ``metric`` on y, one line per graft
    with its interval as a band; a panel per (position, template). A rank is drawn as rank + 1
    on a log axis (1 = the target is the top token); a log-probability on a linear axis in
    nats; a probability on a linear axis from 0 to 1.

    A graft whose ``same_as`` (when the summary has the column) names another graft in a
    panel is not drawn there: its line is that graft's, which the panel's title and the
    legend say (``LT = PRE``).

    Args:
        summary: rows of ``template``, ``graft``, ``position``, ``layer``, ``metric``,
            ``<metric>_lo``, ``<metric>_hi`` (and ``n``, ``same_as``).
        metric: the statistic (``median_rank``, ``mean_logprob``, ``mean_prob``, ...).
        order: the grafts' order (default: as they appear; names not in ``summary`` are
            left out).
        positions: the panel rows' order (default: as they appear).
        model: the model's name, for the title and caption.
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
    width = 3.6 * len(cols) + 2.2
    fig = new_figure(width, 2.9 * len(rows) + 1.3)
    axes = np.atleast_2d(
        fig.subplots(len(rows), len(cols), sharex=True, sharey=True, squeeze=False)
    )
    handles: dict[str, Line2D] = {}
    # drawn graft -> position -> the grafts whose line it is there
    aliases: dict[str, dict[str, list[str]]] = {}
    for r, position in enumerate(rows):
        for c, template in enumerate(cols):
            ax = axes[r, c]
            panel = summary.filter(
                (pl.col("position") == position) & (pl.col("template") == template)
            )
            same = _same_as(panel)
            for k, name in enumerate(grafts):
                if name in same:
                    continue
                line = _draw_line(
                    ax, panel.filter(pl.col("graft") == name).sort("layer"), metric, name, k
                )
                if line is not None:
                    handles.setdefault(name, line)
            for name, drawn in same.items():
                names = aliases.setdefault(drawn, {}).setdefault(position, [])
                if name not in names:
                    names.append(name)
            title = f"{template}, read at {position} ({n_text(panel, None) or 'n=?'})"
            if same:
                note = f"{_same_text(same)} here (grafted only after {position})"
                title += "\n" + textwrap.fill(note, max(40, int(13 * 3.6)))
            ax.set_title(title, fontsize=8.5)
            _layer_axis(ax, panel["layer"].to_list())
            if rank:
                ax.set_yscale("log")
            elif metric == "mean_prob":
                ax.set_ylim(-0.02, 1.02)
            ax.grid(True, which="major", alpha=0.3)
            if r == len(rows) - 1:
                ax.set_xlabel("layer (emb = embeddings; i = output of layer i)", fontsize=8)
            if c == 0:
                ax.set_ylabel(_AXIS_LABELS.get(metric, metric), fontsize=8)
    labels = [_legend_label(n, aliases.get(n, {})) for n in grafts if n in handles]
    fig.legend(
        [handles[n] for n in grafts if n in handles],
        labels,
        loc="outside right upper",
        fontsize=8,
        frameon=False,
    )
    fig.suptitle(
        f"Logit lens of the target: {metric}" + (f", {model}" if model else ""), fontsize=10
    )
    caption = (
        f"{model + '; ' if model else ''}{n_text(summary, None) or 'n=?'} prompts per panel. "
        f"Lines: {metric} over prompts; bands: {whiskers_text(summary, metric)}. The residual "
        "stream at the position, at the embeddings (emb) and after each layer, decoded through "
        "the graft's final norm and unembedding. A graft whose grafted cells all lie after the "
        "read position (same readout) leaves the stream there as an earlier graft's: that line "
        "is drawn once and named in the panel's title and the legend."
    )
    fig.supxlabel(textwrap.fill(caption, max(80, int(17 * width))), fontsize=7)
    return fig


def _legend_label(name: str, aliases: dict[str, list[str]]) -> str:
    """``PRE (= LT, ATTN at FE-last)``: a graft and the grafts drawn as its line, where."""
    if not aliases:
        return graft_label(name)
    where = "; ".join(
        f"{', '.join(graft_label(a) for a in names)} at {position}"
        for position, names in aliases.items()
    )
    return f"{graft_label(name)} (= {where})"


def _same_text(same: dict[str, str]) -> str:
    """``LT, ATTN = PRE; FE+LT = FE``: the grafts drawn as another's line, by that graft."""
    by: dict[str, list[str]] = {}
    for name, drawn in same.items():
        by.setdefault(drawn, []).append(graft_label(name))
    return "; ".join(f"{', '.join(names)} = {graft_label(d)}" for d, names in by.items())


def _same_as(panel: pl.DataFrame) -> dict[str, str]:
    """Graft -> the graft whose line it is in ``panel`` (its ``same_as``), when the summary
    says so."""
    if "same_as" not in panel.columns:
        return {}
    pairs = panel.filter(pl.col("same_as").is_not_null()).select("graft", "same_as")
    return dict(pairs.unique(maintain_order=True).iter_rows())


def _layer_axis(ax: Axes, layers: Sequence[int]) -> None:
    """Integer layer ticks, the embedding layer labelled ``emb`` and set off by a dotted
    line; at most about 12 ticks, the first and last layer always among them."""
    if not layers:
        return
    lo, hi = min(layers), max(layers)
    first = max(lo, 0)
    step = max(1, int(np.ceil((hi - first + 1) / 10)))
    ticks = [t for t in range(first, hi + 1, step) if hi - t >= step / 2] + [hi]
    if lo < first:  # the "emb" tick; its label would overlap a "0" right beside it
        ticks = [lo] + [t for t in ticks if t != first or step == 1]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: layer_label(round(v))))
    if lo == EMBEDDING_LAYER:
        ax.axvline(EMBEDDING_LAYER + 0.5, color="#999999", linestyle=":", linewidth=0.8)


def _draw_line(ax: Axes, part: pl.DataFrame, metric: str, name: str, k: int) -> Line2D | None:
    """One graft's line and band (rank + 1 for ranks); references grey and dashed. Returns
    the line (None when there is nothing to draw)."""
    if part.is_empty():
        return None
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
    (line,) = ax.plot(
        x,
        y,
        style,
        color=color,
        label=graft_label(name),
        linewidth=1.4,
        marker=_MARKERS[k % len(_MARKERS)],
        markersize=2.5,
    )
    ax.fill_between(x, lo, hi, color=color, alpha=0.1, linewidth=0)
    return line
