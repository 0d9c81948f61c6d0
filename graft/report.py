"""Figures of a finished run folder, drawn from its saved summary (no recomputation)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from graft import plots

LAYER_SEP = " | "


def _model_name(config: dict) -> str:
    return str(config.get("options", {}).get("model", "?"))


def draw_figures(folder: str | Path, metric: str = "acc@5") -> list[Path]:
    """Redraw the figures of the run in ``folder`` from ``summary.parquet``; return PNG paths."""
    folder = Path(folder)
    summary_file = folder / "summary.parquet"
    config_file = folder / "config.json"
    if not summary_file.is_file() or not config_file.is_file():
        raise FileNotFoundError(
            f"{folder} is not a finished run folder (needs summary.parquet and config.json)"
        )
    summary = pl.read_parquet(summary_file)
    config = json.loads(config_file.read_text())
    experiment = config.get("experiment", "custom")
    model = _model_name(config)
    order = [g["name"] for g in config.get("grafts", [])]
    out: list[Path] = []
    fig_dir = folder / "figures"
    if experiment == "layers":
        for (group, template), part in summary.partition_by(
            ["group", "template"], as_dict=True, maintain_order=True
        ).items():
            if not group:
                continue  # references
            cells = part.filter(pl.col("graft").str.contains(LAYER_SEP, literal=True))
            split = (
                cells["graft"]
                .str.split_exact(LAYER_SEP, 1)
                .struct.rename_fields(["positions", "layers"])
            )
            frame = cells.with_columns(split.struct.unnest())
            row_order = list(dict.fromkeys(n.split(LAYER_SEP)[0] for n in order if LAYER_SEP in n))
            col_order = list(dict.fromkeys(n.split(LAYER_SEP)[1] for n in order if LAYER_SEP in n))
            fig = plots.heatmap(
                frame,
                value=metric,
                row_order=[r for r in row_order if r in set(frame["positions"])],
                col_order=[c for c in col_order if c in set(frame["layers"])],
                title=f"{metric}: {model}, {template}, components {group} (n={int(part['n'].max())})",
            )
            png, _ = plots.save_figure(fig, fig_dir, f"layers_{_slug(group)}_{template}")
            out.append(png)
        return out
    if experiment == "component":
        for template, part in summary.partition_by(
            "template", as_dict=True, maintain_order=True
        ).items():
            template = template[0] if isinstance(template, tuple) else template
            fig = plots.component_chart(
                part,
                metric,
                group="group",
                order=[n for n in dict.fromkeys(order) if n in set(part["graft"])],
                model=model,
                title=f"{metric} by component set at LT: {model}, {template}",
            )
            png, _ = plots.save_figure(fig, fig_dir, f"component_{template}")
            out.append(png)
        return out
    for (group, template), part in summary.partition_by(
        ["group", "template"], as_dict=True, maintain_order=True
    ).items():
        names = [n for n in dict.fromkeys(order) if n in set(part["graft"])]
        refs = [n for n in names if n in ("PRE", "SFT", "TASK", "RELATION")]
        fig = plots.bar_chart(
            part,
            metric,
            order=names,
            model=model,
            template=f"{template}{' ' + group if group else ''}",
            reference_labels=refs,
        )
        stem = f"{experiment}_{template}" + (f"_{_slug(group)}" if group else "")
        png, _ = plots.save_figure(fig, fig_dir, stem)
        out.append(png)
    return out


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-") or "x"
