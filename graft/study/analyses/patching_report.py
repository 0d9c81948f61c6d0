"""The tables and figures of a patching sweep (:mod:`graft.study.analyses.patching_sweep`): each cell's
effect, weights against patching cell by cell, and the layer x position maps.

The **effect** of a cell is how far it moves the model that runs towards the model that
gives the values, in mean target log-probability over the same prompts:
``(cell - running model) / (giving model - running model)``; restoring, 0 is PRE and 1 is
SFT; breaking, 0 is SFT and 1 is PRE (the share of the finetune's gain destroyed). Its 95%
interval is a percentile bootstrap over prompts, paired (``scipy.stats.bootstrap``).
Accuracies get Wilson intervals; weights against patching is
:mod:`graft.study.analyses.patching_contrasts` (exact McNemar on top-5 hits, the signed-rank
test on the target's log-prob, Holm over every contrast that tests something: cells
identical by construction and sanity checks are reported beside it, not tested).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from scipy.stats import bootstrap

from graft.core.families.arch import Architecture
from graft.core.planning.plan import GraftRow
from graft.errors import ResultsError
from graft.results.compare import read_examples, replicate_column
from graft.results.folder import RunFolder
from graft.results.plots import save_figure
from graft.results.plots.patching import patching_lines, patching_maps
from graft.results.stats.intervals import seed_interval, seed_summary, wilson_interval
from graft.study.analyses.patching_contrasts import (
    CELL,
    EXAMPLE_KEY,
    findings,
    method_contrasts,
)
from graft.study.analyses.patching_sweep import (
    LAYER_SEP,
    UNIT_LABELS,
    WHOLE_GROUP,
    cell_flags,
    split_name,
)
from graft.study.data.prompts import TestExample
from graft.study.specs.choices import UNITS
from graft.study.specs.grafts import NamedGraft

#: The method of the combined tables: a run's executor -> ``weights`` or ``patching``.
METHOD_OF_RUN = {"weights": "weights", "activation": "patching", "residual": "patching"}
#: A sweep graft's name: ``<unit> | L<layer>``.
_SWEEP_NAME = "^(.*)" + re.escape(LAYER_SEP) + r"(\d+)$"


def sweep_examples(
    root: str | Path, runs: Sequence[tuple[str, str]], references: Mapping[str, tuple[str, str]]
) -> pl.DataFrame:
    """Every run's examples (``<root>/<direction>-<run method>``) in one table with the cell
    columns :data:`CELL`, ``method`` and ``role``: ``cell``, or ``running`` / ``giving``
    for the two references of each direction (``references``: direction -> (running
    model's label, giving model's label)), which every run of a direction scores alike and
    which are taken from its first run."""
    frames, seen = [], set()
    for direction, run in runs:
        ex = read_examples(Path(root) / f"{direction}-{run}")
        running, giving = references[direction]
        role = (
            pl.when(pl.col("graft") == running)
            .then(pl.lit("running"))
            .when(pl.col("graft") == giving)
            .then(pl.lit("giving"))
            .otherwise(pl.lit("cell"))
        )
        ex = ex.with_columns(role.alias("role"))
        if direction in seen:
            ex = ex.filter(pl.col("role") == "cell")
        seen.add(direction)
        parts = pl.col("graft").str.extract_groups(_SWEEP_NAME)
        frames.append(
            ex.with_columns(
                pl.lit(direction).alias("direction"),
                pl.lit(METHOD_OF_RUN[run]).alias("method"),
                pl.col("group").alias("kind"),
                pl.coalesce(parts.struct.field("1"), pl.col("graft")).alias("unit"),
                parts.struct.field("2").cast(pl.Int64).alias("layer"),
            )
        )
    return pl.concat(frames, how="diagonal_relaxed")


def _aligned(frame: pl.DataFrame, keys: list[str]) -> np.ndarray:
    return frame.sort(keys)["target_logprob"].to_numpy()


def _share(cell: np.ndarray, running: np.ndarray, giving: np.ndarray, axis: int = -1):
    """The effect: how far ``cell`` moves the running model towards the giving one, in mean
    target log-prob (each array over the same prompts)."""
    return (cell.mean(axis) - running.mean(axis)) / (giving.mean(axis) - running.mean(axis))


def _effect(cell: np.ndarray, running: np.ndarray, giving: np.ndarray, n_boot: int, seed: int):
    """The effect and its 95% paired percentile bootstrap interval over prompts."""
    value = float(_share(cell, running, giving))
    if len(cell) < 2:
        return value, float("nan"), float("nan")
    res = bootstrap(
        (cell, running, giving),
        _share,
        paired=True,
        vectorized=True,
        n_resamples=n_boot,
        method="percentile",
        random_state=np.random.default_rng(seed),
    )
    return value, float(res.confidence_interval.low), float(res.confidence_interval.high)


def _over_seeds(
    row: dict[str, Any],
    arrays: tuple[np.ndarray, np.ndarray, np.ndarray],
    hits: np.ndarray,
    labels: np.ndarray,
) -> dict[str, Any]:
    """A replicated cell's intervals widened over its donors: per seed (``labels``, aligned
    with the cell's, the running and the giving model's log-probs ``arrays`` and the cell's
    top-5 ``hits``), the effect and acc@5 on that seed's rows; acc@5's interval is
    :func:`seed_interval` (the Student-t interval over the seeds widened to the pooled
    Wilson one), the effect's the pooled bootstrap interval widened to the Student-t
    interval over the per-seed effects (rows of one prompt under several donors are not
    independent: the seeds' spread is the honest width). Adds ``seeds`` and ``effect_sd``
    (their standard deviation)."""
    effects, accs = [], []
    for value in np.unique(labels):
        mine = labels == value
        effects.append(float(_share(*(a[mine] for a in arrays))))
        accs.append(float(hits[mine].mean()))
    acc = seed_interval(accs, int(hits.sum()), len(hits), 0.95)
    spread = seed_summary(effects)
    return {
        "acc@5_lo": acc.lo,
        "acc@5_hi": acc.hi,
        "effect_lo": min(row["effect_lo"], spread.lo),
        "effect_hi": max(row["effect_hi"], spread.hi),
        "seeds": spread.n,
        "effect_sd": spread.sd,
    }


def sweep_table(
    examples: pl.DataFrame,
    flags: pl.DataFrame | None = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> pl.DataFrame:
    """One row per (cell, method): ``n``, ``acc@5`` with its Wilson interval,
    ``mean_logprob``, ``effect`` with its interval, and (from ``flags``: per graft name,
    kind, method and prompt, :func:`graft.study.analyses.patching_sweep.cell_flags`) the shares
    ``identical`` (of prompts whose cell is identical by construction) and ``sanity`` (whose
    patch copies the donor's stream). With several donors (finetune or data seeds: a
    ``--finetune-seeds`` run) the effect and acc@5 pool every seed's rows, their intervals
    are widened over the seeds and ``seeds`` and ``effect_sd`` are added (:func:`_over_seeds`)."""
    examples, seed_col = replicate_column(examples)
    keys = [*EXAMPLE_KEY, *([seed_col] if seed_col else [])]
    refs = {
        (d, role): _aligned(
            examples.filter((pl.col("direction") == d) & (pl.col("role") == role)), keys
        )
        for d in examples["direction"].unique().to_list()
        for role in ("running", "giving")
    }
    rows = []
    cells = examples.filter(pl.col("role") == "cell")
    for (direction, kind, unit, layer, method), part in cells.group_by(
        [*CELL, "method"], maintain_order=True
    ):
        lp = _aligned(part, keys)
        running, giving = refs[(direction, "running")], refs[(direction, "giving")]
        if len(lp) != len(running):
            raise ResultsError(f"{direction} {kind} {unit} {layer}: prompts differ from the refs")
        effect, lo, hi = _effect(lp, running, giving, n_boot, seed)
        hits = int(part["hit@5"].sum())
        acc = wilson_interval(hits, part.height)
        row = {
            "direction": direction,
            "kind": kind,
            "unit": unit,
            "layer": layer,
            "method": method,
            "n": part.height,
            "acc@5": hits / part.height,
            "acc@5_lo": acc.lo,
            "acc@5_hi": acc.hi,
            "mean_logprob": float(lp.mean()),
            "effect": effect,
            "effect_lo": lo,
            "effect_hi": hi,
        }
        if seed_col is not None:  # the references are aligned with lp by the same keys
            ordered = part.sort(keys)
            labels = ordered[seed_col].to_numpy()
            hit = ordered["hit@5"].to_numpy()
            row.update(_over_seeds(row, (lp, running, giving), hit, labels))
        rows.append(row)
    table = pl.DataFrame(rows)
    if flags is None:
        return table.with_columns(pl.lit(0.0).alias("identical"), pl.lit(0.0).alias("sanity"))
    shares = flags.group_by([*CELL, "method"]).agg(
        pl.col("identical").mean(), pl.col("sanity").mean()
    )
    return table.join(shares, on=[*CELL, "method"], how="left", nulls_equal=True).with_columns(
        pl.col("identical").fill_null(0.0), pl.col("sanity").fill_null(0.0)
    )


def seed_findings(examples: pl.DataFrame) -> pl.DataFrame:
    """With several donors (a ``--finetune-seeds`` run): each donor's own
    :func:`~graft.study.analyses.patching_contrasts.findings` (peak layer and effect, first
    layer whose effect reaches 0.5, mean effect; each cell's effect on that donor's rows
    against its own PRE and SFT), one row per (direction, kind, unit, method, seed); empty
    with one donor. The pooled findings' layers, read beside these, carry their spread over
    seeds."""
    examples, seed_col = replicate_column(examples)
    if seed_col is None:
        return pl.DataFrame()
    means = examples.group_by("direction", "role", *CELL[1:], "method", seed_col).agg(
        pl.col("target_logprob").mean().alias("mean")
    )
    refs = (
        means.filter(pl.col("role") != "cell")
        .group_by("direction", seed_col)
        .agg(
            *(
                pl.col("mean").filter(pl.col("role") == r).first().alias(r)
                for r in ("running", "giving")
            )
        )
    )
    effects = (
        means.filter(pl.col("role") == "cell")
        .join(refs, on=["direction", seed_col])
        .with_columns(
            ((pl.col("mean") - pl.col("running")) / (pl.col("giving") - pl.col("running"))).alias(
                "effect"
            )
        )
    )
    frames = [
        findings(effects.filter(pl.col(seed_col) == value), pl.DataFrame()).with_columns(
            pl.lit(value).alias("seed")
        )
        for value in sorted(effects[seed_col].unique().to_list())
    ]
    return pl.concat(frames, how="diagonal_relaxed")


def reference_table(examples: pl.DataFrame) -> pl.DataFrame:
    """Per direction, the running and the giving model alone: acc@5 and mean log-prob."""
    refs = examples.filter(pl.col("role") != "cell")
    return (
        refs.group_by("direction", "role", "graft", maintain_order=True)
        .agg(
            pl.len().alias("n"),
            pl.col("hit@5").mean().alias("acc@5"),
            pl.col("target_logprob").mean().alias("mean_logprob"),
        )
        .sort("direction", "role")
    )


# ------------------------------------------------------------------ the whole report


@dataclass
class SweepReport:
    """What :func:`write_sweep_report` wrote.

    Args:
        table: per (cell, method): accuracy, mean log-prob, effect, flags (``sweep``).
        references: per direction, the running and the giving model alone.
        contrasts: weights against patching per cell, with its status.
        findings: per (direction, kind, unit, method): the peak layer and effect, the first
            layer at half the effect, the layers where the methods differ.
        figures: the PNG paths.
    """

    table: pl.DataFrame
    references: pl.DataFrame
    contrasts: pl.DataFrame
    findings: pl.DataFrame
    figures: list[Path] = field(default_factory=list)


def sweep_flags(
    grafts: Mapping[tuple[str, str], Sequence[NamedGraft]],
    arch: Architecture,
    prompts: Sequence[TestExample],
) -> pl.DataFrame:
    """Per (cell, method, prompt), whether the cell is identical by construction and whether
    its patch copies the donor's stream (:func:`graft.study.analyses.patching_sweep.cell_flags`), for
    the cells where either can hold: the whole-depth cells and the residual patches of the
    last layer. ``grafts``: (direction, run method) -> the run's grafts."""
    rows = []
    last = arch.n_layers - 1
    for (direction, run), run_grafts in grafts.items():
        for graft in run_grafts:
            unit, layer = split_name(graft.name)
            if graft.group != WHOLE_GROUP and not (run == "residual" and layer == last):
                continue
            for ex in prompts:
                if not graft.spec.span_names() <= set(ex.spans):
                    continue
                row = GraftRow(ex.input_ids, ex.spans, graft.spec)
                identical, sanity = cell_flags(graft.spec, run, arch, row)
                rows.append(
                    {
                        "direction": direction,
                        "kind": graft.group,
                        "unit": unit,
                        "layer": layer,
                        "method": METHOD_OF_RUN[run],
                        "template": ex.template,
                        "prompt_id": ex.prompt_id,
                        "identical": float(identical),
                        "sanity": float(sanity),
                    }
                )
    schema = {"layer": pl.Int64, "identical": pl.Float64, "sanity": pl.Float64}
    return pl.DataFrame(rows, schema_overrides=schema) if rows else pl.DataFrame()


def write_sweep_report(
    root: str | Path,
    grafts: Mapping[tuple[str, str], Sequence[NamedGraft]],
    references: Mapping[str, tuple[str, str]],
    arch: Architecture,
    prompts: Sequence[TestExample],
    config: Mapping[str, Any],
    *,
    units: Sequence[str] = UNITS,
    model: str | None = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> SweepReport:
    """The combined tables and figures of a sweep whose runs (``grafts``' keys: (direction,
    run method), each run in ``<root>/<direction>-<run method>``) are done: ``sweep``,
    ``references``, ``contrasts``, ``findings`` and, with several donors,
    ``seed_findings`` (``.parquet`` and ``.csv``), and per
    direction ``figures/patching_map_<direction>`` (effect), ``..._acc5`` and
    ``patching_lines_<direction>``; ``config`` (what the sweep ran) goes to
    ``config.json`` with the provenance every run records."""
    folder = RunFolder(root)
    folder.write_config(dict(config), key=sorted(config))
    examples = sweep_examples(root, list(grafts), references)
    flags = sweep_flags(grafts, arch, prompts)
    table = sweep_table(examples, flags if flags.height else None, n_boot=n_boot, seed=seed)
    refs = reference_table(examples)
    contrasts = method_contrasts(examples, table, n_boot=n_boot, seed=seed, flags=flags)
    found = findings(table, contrasts)
    for stem, frame in (
        ("sweep", table),
        ("references", refs),
        ("contrasts", contrasts),
        ("findings", found),
        ("seed_findings", seed_findings(examples)),
    ):
        if frame.height:
            folder.write_summary(frame, stem=stem)
    folder.commit_config()  # a resume's record, after the tables it describes
    labels = {u: UNIT_LABELS.get(u, u) for u in units}
    pngs = []
    for direction in dict.fromkeys(d for d, _ in grafts):
        note = (
            f"{direction}: {'PRE runs, SFT gives' if direction == 'restore' else 'SFT runs, PRE gives'}"
            " the values at one layer (or window) and position unit. weights: the donor's weights"
            " of that part of the layer compute on the run's own activations; patching: the"
            " donor's own-run output of that site is written in ('=': the patch copies the"
            " donor's whole last-token stream, a sanity check). n per cell: "
            f"{int(table['n'].to_numpy().max())} prompts."
        )
        for value, stem in (("effect", ""), ("acc@5", "_acc5")):
            fig = patching_maps(
                table, direction, value, units=units, unit_labels=labels, model=model, note=note
            )
            pngs.append(
                save_figure(fig, folder.path / "figures", f"patching_map_{direction}{stem}")[0]
            )
        fig = patching_lines(
            table, direction, units=units, unit_labels=labels, model=model, note=note
        )
        pngs.append(save_figure(fig, folder.path / "figures", f"patching_lines_{direction}")[0])
    return SweepReport(table, refs, contrasts, found, pngs)
