"""The engine at the paper's model sizes: random-weight models of the exact shapes of gpt2-xl,
pythia-2.8b, Llama-3.2-1B and gemma-1.1-2b (configs written from the published ones in
:mod:`graft.models.paper`; nothing is downloaded), against a plain batched forward.

Run from the repository root::

    python -m benchmarks.paper_scale [--shapes gpt2-xl,llama3.2-1b] [--dtypes float32,bfloat16]
        [--prompts 12] [--batch-size 16] [--repeats 2] [--layers N] [--width D]
        [--threads N] [--device cpu|cuda] [--tokenizer PATH] [--json out.json]
        [--out results/NAME]

The host-bound proxy (``--width 64``, shapes at their own depth, e.g. ``--shapes
gpt2-xl:48,llama3.2-1b:16``): the same depths at a hidden size of 64, where a plain forward
is almost all per-operation host work, as a GPU forward of short rows is; it runs on one
thread unless ``--threads`` says otherwise (the one host thread that drives a GPU); its
goals are E1 <= 1.3 and E3 <= 0.6, and it has no memory goal (its peak is the
interpreter's).

Each (shape, dtype) runs in a child process of its own, so that its memory is measured alone.
The workload is :mod:`benchmarks.real_model`'s (:mod:`benchmarks.workload`): headline prompts
for real actor names (tokenized by ``--tokenizer``, by default the embedded SmolLM2's; its ids
are valid in all four vocabularies), the donor is the base plus seeded noise on every
parameter. Measured side by side after one whole untimed round, medians over ``--repeats``:

(a) E1 position mix (8 grafts per prompt): engine time over a plain batched forward of the base
    over the same rows, goal <= 1.1;
(b) E3 component mix (the paper's 8 component sets at LT, last quarter): the same ratio, goal
    <= 0.4;
(c) peak memory during the timed runs (CUDA max allocated on a GPU, peak RSS on the CPU)
    against 1.1 x (base + donor parameter bytes) + one plain batch of activations.

``--out results/NAME`` also writes the table as ``results/NAME/paper_scale.csv`` (one row per
shape and dtype: :func:`csv_row`) with its provenance in ``results/NAME/provenance.json``
(command, commit, versions, machine, threads); ``python -m benchmarks.results_tables``
renders it where a document marks a ``speed`` table.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from benchmarks._graft_api import architecture_of, machine_info, machine_label
from benchmarks.cli import add_common_options, benchmark_parser, check_common_options
from benchmarks.measure import (
    current_rss,
    environment,
    param_bytes,
    peak_rss,
    release_free_heap,
    reset_peak_rss,
    settings_of,
    write_json,
    write_table,
)
from benchmarks.paper_scale_table import GOALS, PROXY_GOALS, TABLE_HEAD, csv_row, report_line
from benchmarks.paper_shapes import PROXY_HEAD_DIM, random_workload, shape_config
from benchmarks.real_model_measures import measure_paper, measure_times
from benchmarks.workload import graft_rows
from graft.core import LocalExecutor, engine_path
from graft.models import PAPER_CONFIGS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_tokenizer(path: str | None):
    """``path``'s tokenizer, else the embedded SmolLM2's (converted once, offline)."""
    from transformers import AutoTokenizer

    if path is None:
        from graft.models import ensure_embedded

        path = str(ensure_embedded("smollm2-135m"))
    return AutoTokenizer.from_pretrained(path)


def _device_peak(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return peak_rss()


def _reset_peak(device: torch.device) -> bool:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    return reset_peak_rss()


def _held(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    return current_rss()


@torch.no_grad()
def measure_one(
    shape: str,
    dtype_name: str,
    *,
    prompts: int,
    batch_size: int,
    repeats: int,
    layers: int | None,
    device: torch.device,
    tokenizer: str | None,
    paper_examples: int = 0,
    shortcuts: bool = True,
    width: int | None = None,
) -> dict:
    """Load one (shape, dtype), warm up, measure (a)-(c); the JSON-ready result."""
    tok = load_tokenizer(tokenizer)
    dtype = DTYPES[dtype_name]
    goals = GOALS if width is None else PROXY_GOALS
    gc.collect()
    release_free_heap()
    held_before = _held(device)
    w = random_workload(
        shape,
        dtype,
        device,
        layers,
        width,
        tok,
        prompts,
        batch_size,
        executor=LocalExecutor(shortcuts=shortcuts),
    )
    base, donor = w.base, w.donors["sft"]
    weights = param_bytes(base) + param_bytes(donor)
    ps = w.prompts
    gc.collect()
    release_free_heap()
    held_loaded = _held(device)
    # one plain batch of activations: the widest E1 batch, right after loading
    measured_activations = _reset_peak(device)
    w.plain(w.widest_batch(w.e1))
    activations = max(_device_peak(device) - held_loaded, 0)
    # warm-up: one whole untimed round (the first run of each batch shape pays for
    # allocating and faulting in its memory: up to 3x the steady time on the CPU)
    measure_times(w, 1)
    _reset_peak(device)
    times = measure_times(w, repeats)
    peak = _device_peak(device)
    med = {k: statistics.median(v) for k, v in times.items()}
    pre_rows = graft_rows(ps, {"PRE": "none"})
    pre_diff = float((w.engine(pre_rows) - w.plain(pre_rows)).abs().max())
    paper = measure_paper(w, paper_examples, med["fe_lt_engine"] / len(w.fe_lt))
    plan = planned_grafting_peak(base.config, dtype_name, batch_size, ps)
    # on the CPU the interpreter and libraries are held whatever graft does: counted apart
    fixed = held_before if device.type == "cpu" else 0
    bound = 1.1 * weights + activations
    n1, n3 = len(w.e1), len(w.e3)
    e1 = med["e1_engine"] / med["e1_plain"]
    e3 = med["e3_engine"] / med["e3_plain"]
    peak_ratio = (peak - fixed) / bound
    model_info = {
        "shape": shape,
        "dtype": dtype_name,
        "layers": layers or shape_config(shape).num_hidden_layers,
        "width": width or shape_config(shape).hidden_size,
        "params": sum(p.numel() for p in {id(p): p for p in base.parameters()}.values()),
        "arch": architecture_of(base).family,
    }
    return {
        "environment": environment(device, model_info, sys.argv[1:], "benchmarks.paper_scale"),
        "settings": {
            "prompts": len(ps),
            "batch_size": batch_size,
            "repeats": repeats,
            "prompt_tokens": sorted({len(p.input_ids) for p in ps}),
            "measured_activations": measured_activations,
            "engine_path": engine_path(base, {"sft": donor}, shortcuts=shortcuts),
        },
        "times_s": times,
        "medians_s": med,
        "rows": {"e1": n1, "e3": n3},
        "rows_per_s": {
            "e1_engine": n1 / med["e1_engine"],
            "e1_plain": n1 / med["e1_plain"],
            "e3_engine": n3 / med["e3_engine"],
            "e3_plain": n3 / med["e3_plain"],
        },
        "e1_engine_over_plain": e1,
        "e3_engine_over_plain": e3,
        "memory": {
            "method": "CUDA max allocated" if device.type == "cuda" else "peak RSS (VmHWM)",
            "param_bytes_base_plus_donor": weights,
            "fixed_costs": fixed,
            "held_after_loading": held_loaded,
            "peak_timed_runs": peak,
            "activation_bytes_one_plain_batch": activations,
            "bound_bytes": bound,
            "peak_over_bound": peak_ratio,
        },
        "goals": goals,
        # a proxy's peak is the interpreter's, not the engine's: no goal there
        "pass": {
            "e1": e1 <= goals["e1"],
            "e3": e3 <= goals["e3"],
            "peak": peak_ratio <= 1.0 if width is None else None,
        },
        "pre_engine_vs_plain_max_abs_diff": pre_diff,
        "paper": paper,
        "plan": plan,
        "peak_over_plan": (peak - fixed) / plan["peak_bytes"]
        if plan and "peak_bytes" in plan
        else None,
    }


def planned_grafting_peak(config, dtype: str, batch_size: int, prompts) -> dict | None:
    """What graft's memory plan predicts for this run, or None where graft has no planner."""
    try:
        from graft.study import estimate_grafting_bytes
    except ImportError:
        return None
    try:
        plan = estimate_grafting_bytes(
            config,
            dtype=dtype,
            batch_size=batch_size,
            seq_len=max(len(p.input_ids) for p in prompts),
            n_donors=1,
        )
    except Exception as err:  # a planner that cannot size this run is reported, not fatal
        return {"error": f"{type(err).__name__}: {err}"}
    return {"peak_bytes": plan.peak_bytes, "plan": repr(plan)}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = benchmark_parser("benchmarks.paper_scale", __doc__)
    ap.add_argument(
        "--shapes",
        default=",".join(PAPER_CONFIGS),
        help="comma-separated; NAME:LAYERS gives one shape its own depth",
    )
    ap.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated")
    add_common_options(ap, "paper_scale", prompts=12, batch_size=16, paper_examples=0)
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than published")
    ap.add_argument(
        "--width",
        type=int,
        default=None,
        help="a narrow model of this hidden size: the host-bound proxy (goals E1 <= 1.3, E3 <= 0.6)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: 1 with --width, where one thread stands for the host "
        "thread that drives a GPU; else torch's default)",
    )
    ap.add_argument(
        "--no-shortcuts", action="store_true", help="the plain one-pass graft (LocalExecutor)"
    )
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder (default: SmolLM2's)")
    args = ap.parse_args(argv)
    args.shapes = [s for s in args.shapes.split(",") if s]
    args.depths = {}  # a shape written NAME:LAYERS has its own depth (e.g. gpt2-xl:48)
    for i, shape in enumerate(args.shapes):
        name, _, depth = shape.partition(":")
        if depth:
            if not depth.isdigit() or int(depth) < 1:
                ap.error(f"--shapes: {shape!r}: write a depth as NAME:LAYERS, such as gpt2-xl:48")
            args.depths[name] = int(depth)
        args.shapes[i] = name
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    for shape in args.shapes:
        if shape not in PAPER_CONFIGS:
            ap.error(f"--shapes: unknown shape {shape!r}; choose from {', '.join(PAPER_CONFIGS)}")
    for dtype in args.dtypes:
        if dtype not in DTYPES:
            ap.error(f"--dtypes: unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    if args.layers is not None and args.layers < 1:
        ap.error("--layers must be at least 1")
    if args.width is not None and (args.width < PROXY_HEAD_DIM or args.width % PROXY_HEAD_DIM):
        ap.error(f"--width must be a multiple of {PROXY_HEAD_DIM}, such as 64")
    if args.threads is None and args.width is not None:
        args.threads = 1
    if args.threads is not None and args.threads < 1:
        ap.error("--threads must be at least 1")
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device not in ("cpu", "cuda"):
        ap.error(f"--device {args.device!r}: use cpu or cuda")
    check_common_options(ap, args)
    return args


def _child_argv(args: argparse.Namespace, shape: str, dtype: str, out: Path) -> list[str]:
    depth = args.depths.get(shape)
    named = shape if depth is None else f"{shape}:{depth}"
    argv = [sys.executable, "-m", "benchmarks.paper_scale", "--shapes", named, "--dtypes", dtype]
    argv += ["--prompts", str(args.prompts), "--batch-size", str(args.batch_size)]
    argv += ["--repeats", str(args.repeats), "--device", args.device, "--json", str(out)]
    argv += ["--paper-examples", str(args.paper_examples)]
    if args.no_shortcuts:
        argv.append("--no-shortcuts")
    if args.layers is not None:
        argv += ["--layers", str(args.layers)]
    if args.width is not None:
        argv += ["--width", str(args.width)]
    if args.tokenizer is not None:
        argv += ["--tokenizer", args.tokenizer]
    if args.threads is not None:
        argv += ["--threads", str(args.threads)]
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.threads is not None:  # here and in each child: the provenance records this one
        torch.set_num_threads(args.threads)
    combos = [(s, d) for s in args.shapes for d in args.dtypes]
    results: list[dict] = []
    if len(combos) == 1:
        shape, dtype = combos[0]
        results.append(
            measure_one(
                shape,
                dtype,
                prompts=args.prompts,
                batch_size=args.batch_size,
                repeats=args.repeats,
                layers=args.depths.get(shape, args.layers),
                device=torch.device(args.device),
                tokenizer=args.tokenizer,
                paper_examples=args.paper_examples,
                shortcuts=not args.no_shortcuts,
                width=args.width,
            )
        )
    else:
        with tempfile.TemporaryDirectory() as tmp:
            for shape, dtype in combos:
                out = Path(tmp) / f"{shape}-{dtype}.json"
                print(f"== {shape} {dtype}", flush=True)
                done = subprocess.run(_child_argv(args, shape, dtype, out), env=os.environ)
                if done.returncode != 0 or not out.exists():
                    print(f"   failed (exit {done.returncode}); going on", flush=True)
                    continue
                results.extend(json.loads(out.read_text())["results"])
    if results:
        env = results[0]["environment"]
        print(
            f"{env['device']}, torch {env['torch']}, transformers {env['transformers']}; "
            f"{args.prompts} prompts, batch {args.batch_size}, median of {args.repeats}"
        )
        print(TABLE_HEAD)
        for res in results:
            print(report_line(res))
    if args.json is not None:
        write_json(args.json, {"results": results})
        print(f"wrote {args.json}")
    if args.out is not None and results:
        machine = machine_label(machine_info(args.device))
        rows = [csv_row(res, machine) for res in results]
        names = ("prompts", "batch_size", "repeats", "shapes", "dtypes")
        settings = settings_of(args, *names, threads=torch.get_num_threads())
        path = write_table(args.out, "paper_scale", rows, argv, args.device, settings)
        print(f"wrote {path} and its provenance")
    return 0 if len(results) == len(combos) else 1


if __name__ == "__main__":
    sys.exit(main())
