"""graft's memory plan against the peaks that ``benchmarks.paper_scale`` and
``benchmarks.finetune_memory`` measured, from their JSON files (e.g. those that
``scripts/gpu_checks.sh`` wrote on a GPU machine without graft's planner installed).

Run from the repository root::

    python -m benchmarks.plan_vs_measured OUT_DIR/paper_scale_cuda.json OUT_DIR/finetune_*.json

Prints one markdown row per measured run: what ran, the measured peak, the plan's peak and
measured / plan (the goal: within 15%).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.measure import MIB
from benchmarks.paper_scale import shape_config
from graft.study import estimate_finetune_bytes, estimate_grafting_bytes


def rows_of(path: Path) -> list[tuple[str, int, int]]:
    """(what ran, measured peak, planned peak) for every run in one benchmark JSON file."""
    data = json.loads(path.read_text())
    out = []
    if "results" in data:  # benchmarks.paper_scale
        for res in data["results"]:
            model, settings = res["environment"]["model"], res["settings"]
            plan = estimate_grafting_bytes(
                shape_config(model["shape"], model["layers"]),
                dtype=model["dtype"],
                batch_size=settings["batch_size"],
                seq_len=max(settings["prompt_tokens"]),
                n_donors=1,
            )
            peak = res["memory"]["peak_timed_runs"] - res["memory"]["fixed_costs"]
            what = f"grafting {model['shape']} {model['dtype']}, batch {settings['batch_size']}"
            out.append((what, peak, plan.peak_bytes))
    else:  # benchmarks.finetune_memory
        model, settings = data["environment"]["model"], data["settings"]
        plan = estimate_finetune_bytes(
            shape_config(model["shape"], model["layers"]),
            dtype=settings["precision"],
            batch_size=settings["batch_size"],
            seq_len=settings["seq_len"],
            optimizer="adamw",
            gradient_checkpointing=settings["gradient_checkpointing"],
        )
        extra = ", gradient checkpointing" if settings["gradient_checkpointing"] else ""
        what = (
            f"finetune {model['shape']} {settings['precision']}, batch {settings['batch_size']}"
            f" x {settings['seq_len']}{extra}"
        )
        out.append((what, data["peak_bytes"], plan.peak_bytes))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    paths = [Path(p) for p in (sys.argv[1:] if argv is None else argv)]
    if not paths:
        print("usage: python -m benchmarks.plan_vs_measured FILE.json [...]", file=sys.stderr)
        return 2
    print("| run | measured peak | plan | measured / plan |\n|---|---:|---:|---:|")
    for path in paths:
        for what, measured, planned in rows_of(path):
            print(
                f"| {what} | {measured / MIB:,.0f} MiB | {planned / MIB:,.0f} MiB "
                f"| {measured / planned:.3f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
