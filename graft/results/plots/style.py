"""What every graft figure shares: colours, labels, titles, captions, legends and saving.

Figures are drawn on an Agg canvas (:func:`new_figure`); pyplot is never used, so nothing here
changes the global backend or opens a window.
"""

from __future__ import annotations

import os
import re
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from graft.core.language.spec import DEFAULT_DONOR
from graft.errors import ResultsError
from graft.results.compare import CONTROL_SUFFIX
from graft.storage.failures import storage_errors
from graft.storage.files import atomic_path

if TYPE_CHECKING:
    from matplotlib.patches import Patch

REFERENCE_LABELS = ("PRE", "SFT")
GRAFT_COLOR = "#3b6fb6"
REFERENCE_COLORS = ("#8c8c8c", "#4d4d4d", "#b3b3b3", "#666666")
#: Key of ``legend_labels`` for the graft bars (the others are reference names).
GRAFT_KEY = "graft"
#: Colour of a control graft's bar (``<graft> [control]``: the same graft, a control donor).
CONTROL_COLOR = "#b9cde9"
#: Key of ``legend_labels`` for the control bars.
CONTROL_KEY = "control"
#: Default legend text of the control bars.
CONTROL_LEGEND = "the same graft from a control donor (other facts)"
#: Per-replicate values drawn over a mean bar: the column suffix of a summary's mean rows.
PER_SEED_SUFFIX = "_per_seed"
#: What the whiskers of a summary's ``_lo``/``_hi`` columns are when it does not say: summaries
#: written before ``<metric>_ci_method`` columns existed bootstrapped every interval.
DEFAULT_WHISKERS = "95% bootstrap CI"

_ALL_ALL = re.compile(rf"^\s*([^:;@]+?)\s*:\s*all\s*:\s*all\s*(@{DEFAULT_DONOR})?\s*$")


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


def new_figure(width: float, height: float) -> Figure:
    """A figure of ``width`` x ``height`` inches on its own Agg canvas."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def value_format(metric: str) -> str:
    """The format of one value of ``metric`` written on a figure."""
    if "rank" in metric:
        return "{:.1f}"
    if is_unit_metric(metric):
        return "{:.2f}"
    return "{:.3g}"


def is_unit_metric(metric: str) -> bool:
    """Whether ``metric`` lies in 0..1 (accuracies, hit rates, exact-name rates,
    probabilities; not log-probs)."""
    if metric.startswith(("acc", "hit")) or metric == "name_exact":
        return True
    return "prob" in metric and "logprob" not in metric


def metric_label(metric: str) -> str:
    """Axis label of ``metric``, saying which direction is better for ranks."""
    return f"{metric} (lower is better)" if "rank" in metric else metric


def require_columns(frame: pl.DataFrame, columns: Sequence[str], what: str) -> None:
    """Raise :class:`~graft.errors.ResultsError` naming ``what`` when ``frame`` lacks one of
    ``columns``."""
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ResultsError(f"{what}: columns {missing} missing (have {frame.columns})")


def ordered(values: Sequence[Any], order: Sequence[Any] | None, what: str) -> list[Any]:
    """``order`` after checking every entry is among ``values``; default: ``values`` deduplicated."""
    present = list(dict.fromkeys(values))
    if order is None:
        return present
    unknown = [o for o in order if o not in present]
    if unknown:
        raise ResultsError(f"{what} {unknown} not in the frame (have {present})")
    return list(order)


def whiskers_text(frame: pl.DataFrame, metric: str) -> str:
    """What ``metric``'s ``_lo``/``_hi`` columns in ``frame`` are, for a footnote.

    Read from the ``<metric>_ci_method`` column (written by
    :func:`graft.results.summary.summarize`, e.g. ``"95% Wilson interval"`` for accuracies),
    else from a ``ci_method`` column, else :data:`DEFAULT_WHISKERS`.
    """
    for column in (f"{metric}_ci_method", "ci_method"):
        if column in frame.columns and frame.height:
            methods = list(dict.fromkeys(str(m) for m in frame[column].drop_nulls()))
            if methods:
                return " / ".join(methods)
    return DEFAULT_WHISKERS


def error_bars(frame: pl.DataFrame, metric: str) -> np.ndarray | None:
    """``[2, rows]`` distances below/above each value, or None without CI columns."""
    lo_col, hi_col = f"{metric}_lo", f"{metric}_hi"
    if lo_col not in frame.columns or hi_col not in frame.columns:
        return None
    value = frame[metric].cast(pl.Float64).to_numpy()
    lo = frame[lo_col].cast(pl.Float64).to_numpy()
    hi = frame[hi_col].cast(pl.Float64).to_numpy()
    err = np.vstack([value - lo, hi - value])
    return np.clip(np.nan_to_num(err, nan=0.0), 0.0, None)


def value_span(
    frame: pl.DataFrame,
    metric: str,
    margin: float,
    points: Sequence[Sequence[float]] | None = None,
) -> tuple[float, float]:
    """Axis limits from 0 to the farthest bar end, whiskers (and per-replicate ``points``)
    included, ``margin`` times beyond it, on either side of 0 (a mean log-prob is negative);
    (0, 1) without data."""
    columns = [c for c in (metric, f"{metric}_lo", f"{metric}_hi") if c in frame.columns]
    values = frame.select(columns).cast(pl.Float64).to_numpy().ravel()
    extra = [v for vals in points or () for v in vals]
    values = np.concatenate([values, np.asarray(extra, dtype=np.float64)])
    values = values[np.isfinite(values)]
    if not values.size:
        return 0.0, 1.0
    lo, hi = min(0.0, margin * float(values.min())), max(0.0, margin * float(values.max()))
    return (lo, hi) if hi > lo else (0.0, 1.0)


def n_text(frame: pl.DataFrame, n: int | str | None) -> str | None:
    """``"n=…"`` for a title: ``n`` when given, else the range of the ``n`` column (and the
    most prompts dropped)."""
    if n is not None:
        return f"n={n}"
    if "n" not in frame.columns or frame.is_empty():
        return None
    lo, hi = frame["n"].min(), frame["n"].max()
    text = f"n={lo!s}" if lo == hi else f"n={lo!s}\u2013{hi!s}"
    if "n_dropped" in frame.columns:
        dropped = frame["n_dropped"].max()
        if dropped:
            text += f" ({dropped!s} dropped)"
    return text


def title_text(
    title: str | None, metric: str, model: str | None, template: str | None, n_text: str | None
) -> str:
    """``title`` when given, else the metric with model, template and n."""
    if title is not None:
        return title
    parts = [f"model: {model}" if model else None, f"template: {template}" if template else None]
    details = ", ".join(p for p in [*parts, n_text] if p)
    return f"{metric}" + (f" \u2014 {details}" if details else "")


def caption(
    metric: str,
    n_text: str | None,
    whiskers: str | None,
    note: str | None = None,
    width: float | None = None,
) -> str:
    """The footnote of a bar figure: what a bar and a whisker are (and ``note``); wrapped to
    a figure ``width`` inches wide when given."""
    bars = f"Bars: {metric}" + (f" over {n_text} prompts each" if n_text else "")
    parts = [bars, f"whiskers: {whiskers}" if whiskers else "no confidence intervals"]
    text = "; ".join(parts) + "." + (f" {note}" if note else "")
    # about 16 characters of the 7.5-point footnote per inch
    return text if width is None else textwrap.fill(text, max(60, int(16 * width)))


def is_control(name: str) -> bool:
    """Whether ``name`` is a control graft (``<graft> [control]``)."""
    return str(name).endswith(CONTROL_SUFFIX)


def bar_colors(names: Sequence[str], reference_labels: Sequence[str]) -> list[str]:
    """One colour per bar: each reference in its grey, every graft in :data:`GRAFT_COLOR`,
    every control graft in :data:`CONTROL_COLOR`."""
    return [
        _reference_color(name, reference_labels)
        if name in reference_labels
        else CONTROL_COLOR
        if is_control(name)
        else GRAFT_COLOR
        for name in names
    ]


def _reference_color(name: str, reference_labels: Sequence[str]) -> str:
    return REFERENCE_COLORS[list(reference_labels).index(name) % len(REFERENCE_COLORS)]


def legend_handles(
    names: Sequence[str],
    reference_labels: Sequence[str],
    legend_labels: Mapping[str, str] | None,
    graft_color: Any = GRAFT_COLOR,
) -> list[Patch]:
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
    if any(name not in reference_labels and not is_control(name) for name in names):
        handles.append(
            Patch(
                facecolor=graft_color,
                edgecolor="black",
                linewidth=0.5,
                label=legend_labels.get(GRAFT_KEY, "graft"),
            )
        )
    if any(is_control(name) and name not in reference_labels for name in names):
        handles.append(
            Patch(
                facecolor=CONTROL_COLOR,
                edgecolor="black",
                linewidth=0.5,
                label=legend_labels.get(CONTROL_KEY, CONTROL_LEGEND),
            )
        )
    return handles


def per_seed_values(frame: pl.DataFrame, metric: str) -> list[list[float]] | None:
    """Each row's per-replicate values of ``metric`` (a summary's mean rows carry them in
    ``<metric>_per_seed``), or None when ``frame`` has none."""
    column = f"{metric}{PER_SEED_SUFFIX}"
    if column not in frame.columns or frame[column].null_count() == frame.height:
        return None
    return [list(v) if v is not None else [] for v in frame[column].to_list()]


def seed_points_handle() -> Any:
    """The legend entry of the per-replicate dots."""
    from matplotlib.lines import Line2D

    return Line2D(
        [], [], marker="o", linestyle="", color="black", markersize=3, label="each replicate"
    )


def draw_seed_points(
    ax: Any,
    positions: Sequence[float] | np.ndarray,
    values: Sequence[Sequence[float]],
    horizontal: bool,
) -> None:
    """Per-replicate values as small dots over each bar, spread a little across it."""
    for pos, vals in zip(positions, values, strict=True):
        if not vals:
            continue
        spread = np.linspace(-0.18, 0.18, len(vals)) if len(vals) > 1 else np.zeros(1)
        xs, ys = pos + spread, np.asarray(vals, dtype=np.float64)
        if horizontal:
            xs, ys = ys, xs
        ax.scatter(xs, ys, s=7, color="black", zorder=3, linewidths=0)


def save_figure(
    fig: Figure, folder: str | os.PathLike[str], stem: str, dpi: int = 150
) -> tuple[Path, Path]:
    """Write ``<folder>/<stem>.png`` (at ``dpi``) and ``<stem>.pdf``; return both paths.

    Raises:
        StorageError: the disk is full (or the folder read-only); no figure is left
            half-written under its name.
    """
    folder = Path(folder)
    with storage_errors("the figures", folder):
        folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in ("png", "pdf"):
        path = folder / f"{stem}.{fmt}"
        with storage_errors("the figure", path), atomic_path(path) as tmp:
            fig.savefig(tmp, format=fmt, dpi=dpi)
        paths.append(path)
    return paths[0], paths[1]
