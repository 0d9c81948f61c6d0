"""Finetune memory and step time at the paper's model sizes, against graft's memory plan.

Run from the repository root::

    python -m benchmarks.finetune_memory [--shape gpt2-xl] [--precision mixed] [--batch-size 4]
        [--seq-len 64] [--steps 4] [--layers N] [--gradient-checkpointing] [--device cpu|cuda]
        [--json out.json]

A random-weight model of the paper model's exact shape (:mod:`graft.models.paper`; nothing is
downloaded) takes ``--steps`` optimisation steps of fused AdamW (lr 2e-5, weight decay 0.01, as
the paper's preset) on random token batches of ``--batch-size`` x ``--seq-len``, the way graft's
finetune trains: ``mixed`` keeps float32 master weights and autocasts the forward and backward
to bfloat16 (what the Trainer's ``bf16``/``fp16`` flags do; fp16 adds a loss scaler, no
memory), ``float32`` trains in float32, ``bfloat16`` holds weights, gradients and optimizer
state in bfloat16. Prints the peak (CUDA max allocated on a GPU; peak RSS less what the process
held before the model on the CPU), the median step time after the first step, and the peak that
:func:`graft.study.planning.memory.estimate_finetune_bytes` predicts for the same run.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from benchmarks.cli import benchmark_parser
from benchmarks.measure import (
    MIB,
    current_rss,
    environment,
    peak_rss,
    release_free_heap,
    reset_peak_rss,
    write_json,
)
from benchmarks.paper_shapes import random_model, shape_config
from benchmarks.plan_check import train_as_asked
from graft.models import PAPER_CONFIGS

PRECISIONS = {"mixed": torch.float32, "float32": torch.float32, "bfloat16": torch.bfloat16}


def planned_peak(args: argparse.Namespace) -> dict | None:
    """The plan's prediction for this run, or None where graft has no planner."""
    try:
        from graft.study import estimate_finetune_bytes
    except ImportError:
        return None
    try:
        plan = estimate_finetune_bytes(
            shape_config(args.shape, args.layers),
            dtype=args.precision,
            batch_size=args.batch_size,
            seq_len=args.seq_len,
            optimizer="adamw",
            gradient_checkpointing=args.gradient_checkpointing,
        )
    except Exception as err:  # a planner that cannot size this run is reported, not fatal
        return {"error": f"{type(err).__name__}: {err}"}
    return {"peak_bytes": plan.peak_bytes, "plan": repr(plan)}


def run(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    gc.collect()
    release_free_heap()
    held_before = torch.cuda.memory_allocated(device) if device.type == "cuda" else current_rss()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        reset_peak_rss()
    model = random_model(args.shape, PRECISIONS[args.precision], device, args.layers)
    seconds = train_as_asked(model, args)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) - held_before
    else:
        peak = peak_rss() - held_before
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    plan = planned_peak(args)
    info = {"shape": args.shape, "layers": model.config.num_hidden_layers, "params": params}
    result = {
        "environment": environment(device, info, args.argv, "benchmarks.finetune_memory"),
        "settings": {
            k: getattr(args, k)
            for k in ("precision", "batch_size", "seq_len", "steps", "gradient_checkpointing")
        },
        "step_seconds": seconds,
        "median_step_s_after_first": statistics.median(seconds[1:] or seconds),
        "peak_bytes": peak,
        "plan": plan,
        "measured_over_plan": peak / plan["peak_bytes"] if plan and "peak_bytes" in plan else None,
    }
    return result


def report(res: dict) -> str:
    m, s = res["environment"]["model"], res["settings"]
    line = (
        f"{m['shape']} ({m['layers']} layers, {m['params'] / 1e9:.2f} B params), "
        f"{s['precision']}, batch {s['batch_size']} x {s['seq_len']} tokens"
        f"{', gradient checkpointing' if s['gradient_checkpointing'] else ''} on "
        f"{res['environment']['device']}: peak {res['peak_bytes'] / MIB:,.0f} MiB, step "
        f"{res['median_step_s_after_first']:.3f} s (median after the first)"
    )
    if res["measured_over_plan"] is not None:
        line += (
            f"; plan {res['plan']['peak_bytes'] / MIB:,.0f} MiB, measured/plan "
            f"{res['measured_over_plan']:.2f}"
        )
    return line


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = benchmark_parser("benchmarks.finetune_memory", __doc__)
    ap.add_argument("--shape", default="gpt2-xl", choices=list(PAPER_CONFIGS))
    ap.add_argument("--precision", default="mixed", choices=list(PRECISIONS))
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than published")
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    for name in ("batch_size", "seq_len", "steps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.layers is not None and args.layers < 1:
        ap.error("--layers must be at least 1")
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.device not in ("cpu", "cuda"):
        ap.error(f"--device {args.device!r}: use cpu or cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: this machine has no CUDA device; use --device cpu")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    res = run(args)
    print(report(res))
    if args.json is not None:
        write_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
