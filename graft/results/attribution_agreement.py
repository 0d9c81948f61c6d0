"""How well graft attribution's estimates hold against real grafts: per module kind and
position unit, Pearson, sign agreement and top-k overlap of the single cells
(:func:`cell_summary`; any set of checked cells taken together: :func:`pooled_agreement`,
with a bootstrap interval over prompts: :func:`pearson_interval`), and the error of
multi-cell sets (:func:`multicell_summary`).

The bar the issue set for the embedded model is Pearson >= 0.95 and sign agreement >= 0.95
(:data:`BAR`); signs are compared over the cells that move the target, those whose real
effect is at least :data:`MOVING` of the group's largest (a sign of a near-zero effect is
noise).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from graft.errors import StatsError

__all__ = [
    "BAR",
    "MIN_INTERVAL_PROMPTS",
    "MOVING",
    "TOP_K",
    "cell_summary",
    "multicell_summary",
    "pearson_interval",
    "pooled_agreement",
    "reported_interval",
]

#: Pearson and sign agreement an estimate must reach
BAR = 0.95
#: the share of a group's largest real effect from which a cell counts as moving the target
MOVING = 0.05
#: the k of the top-k overlap
TOP_K = 5
#: the fewest prompts a Pearson's bootstrap interval over prompts is given for (with fewer,
#: a percentile bootstrap has too few distinct resamples to mean anything)
MIN_INTERVAL_PROMPTS = 10
_CELL = ["prompt", "layer", "unit", "kind"]


def _pearson(x: np.ndarray, y: np.ndarray) -> float | None:
    if len(x) < 3 or np.std(x) == 0 or np.std(y) == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def _sign_agreement(estimate: np.ndarray, real: np.ndarray) -> tuple[float | None, int]:
    """(the share of moving cells whose estimate has the real effect's sign, their count)."""
    if not len(real) or not np.abs(real).max() > 0:
        return None, 0
    moving = np.abs(real) >= MOVING * np.abs(real).max()
    same = np.sign(estimate[moving]) == np.sign(real[moving])
    return float(same.mean()), int(moving.sum())


def pooled_agreement(checked: pl.DataFrame) -> dict[str, Any]:
    """Pearson and sign agreement over every row of ``checked`` (columns ``estimate`` and
    ``real``: cells of any units and kinds, pooled) as :func:`cell_summary` computes them per
    group: ``cells``, ``pearson``, ``sign_agreement`` (over the ``moving`` cells, whose real
    effect is at least :data:`MOVING` of the largest here), ``moving`` and ``meets_bar``."""
    estimate, real = checked["estimate"].to_numpy(), checked["real"].to_numpy()
    pearson = _pearson(estimate, real)
    sign, moving = _sign_agreement(estimate, real)
    return {
        "cells": len(checked),
        "pearson": pearson,
        "sign_agreement": sign,
        "moving": moving,
        "meets_bar": None
        if pearson is None or sign is None
        else bool(pearson >= BAR and sign >= BAR),
    }


def pearson_interval(
    checked: pl.DataFrame, n_boot: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """The percentile bootstrap interval of the Pearson of :func:`pooled_agreement` over
    ``checked``'s rows, resampling whole prompts (column ``prompt``): a prompt's cells share
    its run and are no independent draws, so the prompts are the sample
    (``scipy.stats.bootstrap``, each resample's Pearson from its prompts' sums; ``seed``
    seeds its generator).

    Raises:
        StatsError: fewer than two prompts, or a Pearson undefined on the rows.
    """
    from scipy.stats import bootstrap

    if _pearson(checked["estimate"].to_numpy(), checked["real"].to_numpy()) is None:
        raise StatsError("Pearson is undefined on these rows (fewer than 3, or a constant column)")
    parts = checked.partition_by("prompt", maintain_order=True)
    if len(parts) < 2:
        raise StatsError("a bootstrap over prompts needs rows of two prompts or more")
    # a resample's Pearson from the sums of its prompts' cells (centred on the whole
    # table's means, against cancellation): the same number as over the rows put together
    x_mean, y_mean = checked["estimate"].mean(), checked["real"].mean()
    sums = np.empty((len(parts), 6))
    for i, part in enumerate(parts):
        x = part["estimate"].to_numpy() - x_mean
        y = part["real"].to_numpy() - y_mean
        sums[i] = (len(x), x.sum(), y.sum(), (x * x).sum(), (y * y).sum(), (x * y).sum())

    def pearson(picks: np.ndarray, axis: int = -1) -> np.ndarray:
        total = np.moveaxis(sums[np.moveaxis(picks, axis, -1).astype(int)].sum(axis=-2), -1, 0)
        n, sx, sy, sxx, syy, sxy = total
        with np.errstate(divide="ignore", invalid="ignore"):
            return (sxy - sx * sy / n) / np.sqrt((sxx - sx * sx / n) * (syy - sy * sy / n))

    result = bootstrap(
        (np.arange(len(parts)),),
        pearson,
        vectorized=True,
        n_resamples=n_boot,
        confidence_level=level,
        method="percentile",
        random_state=np.random.default_rng(seed),
    )
    interval = result.confidence_interval
    return float(interval.low), float(interval.high)


def reported_interval(checked: pl.DataFrame) -> tuple[float, float] | None:
    """:func:`pearson_interval` of ``checked``'s rows where they come from at least
    :data:`MIN_INTERVAL_PROMPTS` prompts and their Pearson is defined; else None (the
    tables leave it empty)."""
    if checked["prompt"].n_unique() < MIN_INTERVAL_PROMPTS:
        return None
    if _pearson(checked["estimate"].to_numpy(), checked["real"].to_numpy()) is None:
        return None
    return pearson_interval(checked)


def _top_overlap(group: pl.DataFrame, k: int) -> float | None:
    """The mean over prompts of |top k by |estimate|  ∩  top k by |real|| / k (prompts with
    more than k cells only)."""
    shares = []
    for _, cells in group.group_by("prompt"):
        if len(cells) <= k:
            continue
        keys = cells.select(pl.concat_str(["layer", "unit", "kind"], separator=":")).to_series()
        estimate = np.abs(cells["estimate"].to_numpy())
        real = np.abs(cells["real"].to_numpy())
        top_e = set(keys.gather(np.argsort(-estimate, kind="stable")[:k]).to_list())
        top_r = set(keys.gather(np.argsort(-real, kind="stable")[:k]).to_list())
        shares.append(len(top_e & top_r) / k)
    return float(np.mean(shares)) if shares else None


def cell_summary(
    table: pl.DataFrame, checked: pl.DataFrame | None = None, top_k: int = TOP_K
) -> pl.DataFrame:
    """One row per (unit, kind) of :func:`graft.attribute`'s ``table``, then one per kind
    over every unit (``unit`` = ``all``).

    Columns: ``unit``, ``kind``, ``cells``, ``mean_estimate`` (over prompts and layers),
    ``top_layer`` (the layer of the largest mean ``|estimate|``); with ``checked`` (the
    table of :func:`graft.core.verify_attribution`, a column ``real``) also ``verified``
    (cells grafted for real), ``pearson``, ``pearson_low`` and ``pearson_high`` (its 95%
    interval over the group's prompts, :func:`reported_interval`: empty under
    :data:`MIN_INTERVAL_PROMPTS` prompts), ``sign_agreement`` (over the ``moving``
    cells), ``moving``, ``top_k_overlap`` (only where every cell of the group was verified:
    the top k of a subset says nothing), ``top_k`` and ``meets_bar`` (Pearson and sign
    agreement both >= :data:`BAR`, the point estimates)."""
    groups: list[tuple[str, str, pl.DataFrame]] = []
    kinds = table["kind"].unique(maintain_order=True).to_list()
    for unit in table["unit"].unique(maintain_order=True).to_list():
        for kind in kinds:
            rows = table.filter((pl.col("unit") == unit) & (pl.col("kind") == kind))
            groups.append((unit, kind, rows))
    for kind in kinds:
        groups.append(("all", kind, table.filter(pl.col("kind") == kind)))
    records: list[dict[str, Any]] = []
    for unit, kind, rows in groups:
        mean = rows.group_by("layer").agg(pl.col("estimate").mean())
        top = mean.sort(pl.col("estimate").abs(), descending=True)["layer"]
        record: dict[str, Any] = {
            "unit": unit,
            "kind": kind,
            "cells": len(rows),
            "mean_estimate": float(rows["estimate"].to_numpy().mean()) if len(rows) else 0.0,
            "top_layer": int(top[0]) if len(top) else None,
        }
        if checked is not None:
            both = rows.join(checked.select(*_CELL, "real"), on=_CELL, how="inner")
            pooled = pooled_agreement(both)
            low, high = reported_interval(both) or (None, None)
            record.update(
                verified=pooled["cells"],
                pearson=pooled["pearson"],
                pearson_low=low,
                pearson_high=high,
                sign_agreement=pooled["sign_agreement"],
                moving=pooled["moving"],
                top_k_overlap=_top_overlap(both, top_k) if len(both) == len(rows) else None,
                top_k=top_k,
                meets_bar=pooled["meets_bar"],
            )
        records.append(record)
    return pl.DataFrame(records, infer_schema_length=None)


def multicell_summary(multi: pl.DataFrame) -> pl.DataFrame:
    """One row per set of :func:`graft.core.verify_multicell`'s table: ``set``, ``grafts``,
    ``mean_estimate``, ``mean_real``, ``mean_abs_error``, ``median_relative_error``
    (``|estimate - real| / |real|``), ``pearson`` (over the set's grafts, where there are
    at least three) and ``sign_agreement`` (over all its grafts)."""
    records = []
    for name in multi["set"].unique(maintain_order=True).to_list():
        rows = multi.filter(pl.col("set") == name)
        estimate, real = rows["estimate"].to_numpy(), rows["real"].to_numpy()
        error = np.abs(estimate - real)
        with np.errstate(divide="ignore", invalid="ignore"):
            relative = np.where(real != 0, error / np.abs(real), np.nan)
        records.append(
            {
                "set": name,
                "grafts": len(rows),
                "mean_estimate": float(estimate.mean()),
                "mean_real": float(real.mean()),
                "mean_abs_error": float(error.mean()),
                "median_relative_error": float(np.nanmedian(relative))
                if np.isfinite(relative).any()
                else None,
                "pearson": _pearson(estimate, real),
                "sign_agreement": float((np.sign(estimate) == np.sign(real)).mean()),
            }
        )
    return pl.DataFrame(records, infer_schema_length=None)
