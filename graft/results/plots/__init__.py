"""Figures of graft summaries (matplotlib, headless).

Every function takes a polars frame (usually from :func:`graft.results.summary.summarize`) and
returns a :class:`matplotlib.figure.Figure` drawn on an Agg canvas. pyplot is never used,
so nothing here changes the global backend or opens a window; :func:`save_figure` writes
PNG and PDF files.

- :mod:`graft.results.plots.bars`: :func:`bar_chart` and :func:`component_chart`;
- :mod:`graft.results.plots.heatmap`: :func:`heatmap`, :func:`attribution_map`;
- :mod:`graft.results.plots.lens`: logit-lens lines per layer;
- :mod:`graft.results.plots.patching`: a patching sweep's layer x position maps and lines;
- :mod:`graft.results.plots.style`: colours, labels, captions, legends, :func:`save_figure`.
"""

from graft.results.plots.bars import PAPER_GID, bar_chart, component_chart
from graft.results.plots.heatmap import attribution_map, heatmap
from graft.results.plots.style import (
    DEFAULT_WHISKERS,
    GRAFT_COLOR,
    GRAFT_KEY,
    REFERENCE_COLORS,
    REFERENCE_LABELS,
    caption,
    graft_label,
    metric_label,
    n_text,
    save_figure,
    whiskers_text,
)

__all__ = [
    "DEFAULT_WHISKERS",
    "GRAFT_COLOR",
    "GRAFT_KEY",
    "PAPER_GID",
    "REFERENCE_COLORS",
    "REFERENCE_LABELS",
    "attribution_map",
    "bar_chart",
    "caption",
    "component_chart",
    "graft_label",
    "heatmap",
    "metric_label",
    "n_text",
    "save_figure",
    "whiskers_text",
]
