"""The patching sweep's speed: the one-cell path, layer reuse and the floor, side by side.

A cell of ``graft-exp patching`` changes nothing below its first layer ``k`` and nothing
before its unit's first position ``p``. For each method (``weights``, ``activation``,
``residual``) and position unit this runs the sweep's cells (every layer, the method's kinds)
on ``--prompts`` headline prompts twice, on the same rows and batches:

- old: every cell its whole forward (``executor_for(method, reuse=False)``: the engine's
  shortcuts for weights, one donor trace and one patched trace per batch for patching);
- new: each cell from its first changed layer on, the layers below once per prompt
  (``executor_for(method)``, :mod:`graft.core.execution.resume`);

and states the floor: a plain batched forward of the same rows (same kernels and batch size,
timed beside them) scaled to the work no reuse can avoid, ``(L - k) x (T - p)`` token layers
per cell, plus one plain forward per prompt (two for patching: the donor's too).
``--layer-step N`` sweeps every N-th layer only (a shorter run; the rows per cell are the
same). ``--methods e7`` times E7's map the same way (``graft-exp layers --windows N`` at FE,
LT and FE+LT, every component, ``N`` the layer step; old: every row whole, new: layer
reuse). It
prints rows per CPU second of each (one thread by default: CPU time counts the work done
whatever else the machine runs), the ratios new/old and new/floor, and the largest |logit difference|
between old and new (float rounding). The donor is the base perturbed (``perturbed_copy``):
the cost of a cell does not depend on what the donor learnt.

Run from the repository root (a few minutes on a loaded 2-core CPU)::

    python -m benchmarks.sweep_floor [--model smollm2-135m] [--prompts 1] [--batch-size 32]
        [--methods weights,activation,residual,e7] [--units FE[:-1],FE[-1],(FE+LT)^C,LT]
        [--layer-step 3] [--random-weights] [--json out.json]
"""

from __future__ import annotations

import sys
import time
import types
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from benchmarks._graft_api import (
    GraftRow,
    architecture_of,
    default_pad_id,
    perturbed_copy,
    run_grafts,
)
from benchmarks.cli import benchmark_parser
from benchmarks.measure import write_json
from benchmarks.prefix_floor import _model_and_tokenizer, add_random_weights, model_record
from benchmarks.workload import headline_prompts, plain_forward

METHODS = ("weights", "activation", "residual", "e7")
#: E7's position sets (``graft-exp layers``' default rows), the ``e7`` method's units.
E7_POSITIONS = ("FE", "LT", "FE+LT")


def cpu_seconds(fn: Callable[[], object]) -> float:
    """CPU seconds of one call of ``fn`` (this process): on one thread, the work done,
    whatever else the machine runs (wall time on a shared machine measures the others)."""
    start = time.process_time()
    fn()
    return time.process_time() - start


def cell_work(arch, row: GraftRow) -> int:
    """Token layers a cell cannot skip: ``(L - k) x (T - p)`` for its first changed layer
    ``k`` (the embeddings count as layer 0, the head as ``L``) and first position ``p``."""
    res = row.spec.resolve(arch, len(row.input_ids), dict(row.spans))
    layers = [max(layer, 0) for layer, _ in res.cells]
    positions = [pos for cell in res.cells.values() for pos in cell]
    if not layers:
        return 0
    return (arch.n_layers - min(layers)) * (len(row.input_ids) - min(positions))


def sweep_cells(arch, method: str, unit: str, layer_step: int = 1) -> list:
    """The sweep's cells of ``method`` at ``unit`` (every ``layer_step``-th layer, the
    method's kinds), as ``graft-exp patching`` makes them in the restore direction, without
    the references; ``e7``: E7's windows of ``layer_step`` layers of every component
    (``graft-exp layers --windows K``) at the position set ``unit``."""
    from graft.study import direction_models, sweep_grafts

    if method == "e7":
        from graft.core import GraftSpec
        from graft.study import layer_windows

        windows = layer_windows(arch.n_layers, str(layer_step))
        return [types.SimpleNamespace(spec=GraftSpec.parse(f"{unit}:{w}:block")) for w in windows]

    grafts = sweep_grafts(arch, method, direction_models("restore", "sft"), [unit], whole_depth=())
    return [  # the two references have no group
        g for g in grafts if g.group and int(g.name.rsplit(" | L", 1)[1]) % layer_step == 0
    ]


@torch.no_grad()
def measure(
    base, donor, prompts, method: str, unit: str, batch_size: int, pad_id: int, layer_step: int
):
    """One (method, unit): seconds of old and new, the floor's seconds, rows, max |diff|."""
    from graft.core import LocalExecutor
    from graft.study import executor_for

    def executor(reuse: bool):
        if method == "e7":  # E7's grafts: the engine's own executor, with or without reuse
            return LocalExecutor(resume_layers=True) if reuse else None
        return executor_for(method, reuse)

    arch = architecture_of(base)
    cells = sweep_cells(arch, method, unit, layer_step)
    rows = [GraftRow(p.input_ids, p.spans, g.spec) for p in prompts for g in cells]
    donors = {"sft": donor}
    outs = {}

    def way(reuse: bool):
        def call():
            outs[reuse] = run_grafts(
                base, donors, rows, batch_size=batch_size, executor=executor(reuse)
            )

        return call

    plain_rows = [GraftRow(r.input_ids, r.spans) for r in rows]
    t_old, t_new = cpu_seconds(way(False)), cpu_seconds(way(True))
    t_plain = cpu_seconds(lambda: plain_forward(base, plain_rows, batch_size, pad_id))
    diff = float((outs[False] - outs[True]).abs().max())
    forwards = 1 if method in ("weights", "e7") else 2
    plain_work = forwards * sum(arch.n_layers * len(p.input_ids) for p in prompts)
    floor_work = sum(cell_work(arch, r) for r in rows) + plain_work
    full_work = sum(arch.n_layers * len(r.input_ids) for r in rows)
    return t_old, t_new, t_plain * floor_work / full_work, len(rows), diff


def main(argv: Sequence[str] | None = None) -> int:
    from graft.study import UNITS

    ap = benchmark_parser("benchmarks.sweep_floor", __doc__)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=32, help="rows per forward")
    ap.add_argument("--methods", default=",".join(METHODS[:3]))
    ap.add_argument("--units", default=",".join(UNITS))
    ap.add_argument("--layer-step", type=int, default=3, help="sweep every N-th layer")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (CPU time is timed)")
    add_random_weights(ap)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    units = [u for u in args.units.split(",") if u]
    if min(args.prompts, args.batch_size, args.layer_step, args.threads) < 1:
        ap.error("--prompts, --batch-size, --layer-step and --threads must be at least 1")
    if not methods or set(methods) - set(METHODS):
        ap.error(f"--methods: some of {', '.join(METHODS)}")
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _run(args, methods, units)
    finally:
        torch.set_num_threads(threads)


def _run(args, methods: list[str], units: list[str]) -> int:
    """:func:`main` after its checks, on ``args.threads`` threads."""
    base, tokenizer = _model_and_tokenizer(args.model, args.random_weights)
    donor = perturbed_copy(base, seed=1)
    pad_id = default_pad_id(base.config)
    max_tokens = getattr(base.config, "max_position_embeddings", 10**9)
    prompts = headline_prompts(tokenizer, args.prompts, max_tokens)
    step = args.layer_step
    measure(base, donor, prompts[:1], "weights", "LT", args.batch_size, pad_id, 10**6)  # warm-up
    print(
        f"{args.model}{' (random weights)' if args.random_weights else ''}, {len(prompts)} "
        f"prompts, every {step} layer(s), batch {args.batch_size}, {torch.get_num_threads()} "
        "thread(s); rows per CPU second"
    )
    header = f"{'method':<11}{'unit':<11}{'rows':>6}{'old':>9}{'new':>9}{'floor':>9}"
    print(header + f"{'new/old':>9}{'new/floor':>10}{'max|diff|':>11}")
    results = []
    totals = [0.0, 0.0, 0.0]
    for method in methods:
        for unit in E7_POSITIONS if method == "e7" else units:
            t_old, t_new, floor, n, diff = measure(
                base, donor, prompts, method, unit, args.batch_size, pad_id, step
            )
            totals = [totals[0] + t_old, totals[1] + t_new, totals[2] + floor]
            print(
                f"{method:<11}{unit:<11}{n:>6}{n / t_old:>9.1f}{n / t_new:>9.1f}{n / floor:>9.1f}"
                f"{t_new / t_old:>9.2f}{t_new / floor:>10.2f}{diff:>11.1e}"
            )
            results.append(
                dict(
                    method=method,
                    unit=unit,
                    rows=n,
                    old_s=t_old,
                    new_s=t_new,
                    floor_s=floor,
                    max_abs_diff=diff,
                )
            )
    old, new, floor = totals
    print(
        f"sweep: old {old:.1f} s, new {new:.1f} s, floor {floor:.1f} s (CPU); new/old {new / old:.2f}, "
        f"new/floor {new / floor:.2f}"
    )
    if args.json is not None:
        write_json(
            args.json,
            {
                **model_record(args, len(prompts)),
                "batch_size": args.batch_size,
                "threads": torch.get_num_threads(),
                "layer_step": step,
                "cells": results,
                "old_s": old,
                "new_s": new,
                "floor_s": floor,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
