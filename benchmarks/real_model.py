"""The engine on a real model against a plain batched forward, the paper's routine and memory.

Run from the repository root::

    python -m benchmarks.real_model [--model smollm2-135m] [--prompts 32] [--batch-size 32]
        [--repeats 3] [--paper-examples 2] [--json out.json]

Workload: headline prompts ("<actor> starred in a movie with") for real actor names, the first
actor as the FE span, left padding, last-token logits; the donor is the base plus seeded
noise on every parameter (no finetune). Measured side by side in this one process, warm-up
first, medians over ``--repeats``:

(a) E1 position mix (PRE, SFT, FE, LT, FE+LT, (FE+LT)^C, FE^C, LT^C): engine time over a
    plain batched forward of the base over the same rows (same batches, same padding);
(b) E3 component mix (the paper's 8 component sets at LT, last quarter): the same ratio;
(c) the paper's routine (benchmarks.paper_routine) vs the engine per FE+LT example;
(d) peak memory (RSS; CUDA max allocated on a GPU) vs base + donor parameter bytes.

Every ratio is printed with its goal and PASS/FAIL; ``--json`` writes every number.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from benchmarks._graft_api import (
    GraftRow,
    architecture_of,
    default_pad_id,
    perturbed_copy,
    run_grafts,
)
from benchmarks.measure import (
    MIB,
    current_rss,
    environment,
    param_bytes,
    peak_rss,
    release_free_heap,
    reset_peak_rss,
    timed,
    write_json,
)
from benchmarks.paper_routine import paper_rows
from benchmarks.workload import (
    Prompt,
    batches_of,
    graft_rows,
    headline_prompts,
    plain_forward,
)
from graft.errors import GraftError
from graft.study.specs.grafts import COMPONENT_SETS

#: E1: every component in every layer at each position set, plus the two references.
E1_GRAFTS = {
    "PRE": "none",
    "SFT": "ALL:all:all; head=donor",
    "FE": "FE:all:all",
    "LT": "LT:all:all",
    "FE+LT": "FE+LT:all:all",
    "(FE+LT)^C": "(FE+LT)^C:all:all",
    "FE^C": "FE^C:all:all",
    "LT^C": "LT^C:all:all",
}
#: E3: the paper's component sets (ATTN = q,k,v; FFN = gate,up,down) at LT, last quarter.
E3_GRAFTS = {name: f"LT:q4:{components}" for name, components in COMPONENT_SETS.items()}

GOALS = {
    "e1_engine_over_plain": ("<=", 1.2),
    "e3_engine_over_plain": ("<=", 0.5),
    "paper_over_engine_per_example": (">=", 100.0),
    "peak_rss_over_bound": ("<=", 1.0),
    "peak_minus_fixed_costs_over_bound": ("<=", 1.0),
}


# ------------------------------------------------------------------------------ workload


# --------------------------------------------------------------------------- plain forward


# ------------------------------------------------------------------------------ memory


# ------------------------------------------------------------------------------ timing


def check(name: str, value: float) -> dict:
    """``value`` against the goal of ``name``: {"value", "goal", "pass"}."""
    op, goal = GOALS[name]
    ok = value <= goal if op == "<=" else value >= goal
    return {"value": value, "goal": f"{op} {goal}", "pass": bool(ok)}


# -------------------------------------------------------------------------------- main


@dataclass
class Workload:
    """The models and rows of one benchmark run.

    Args:
        base: the base model.
        donors: ``{"sft": perturbed copy of the base}``.
        prompts: the headline prompts.
        e1: E1 rows (prompt-major, 8 grafts per prompt).
        e3: E3 rows (prompt-major, 8 grafts per prompt).
        fe_lt: one FE+LT row per prompt.
        batch_size: rows per forward pass (engine and plain alike).
        pad_id: padding id (engine and plain alike).
        device: the models' device.
        executor: the engine's executor (None: graft's default, shortcuts on).
    """

    base: nn.Module
    donors: dict[str, nn.Module]
    prompts: list[Prompt]
    e1: list[GraftRow]
    e3: list[GraftRow]
    fe_lt: list[GraftRow]
    batch_size: int
    pad_id: int
    device: torch.device
    executor: object | None = None

    def engine(self, rows: Sequence[GraftRow]) -> torch.Tensor:
        return run_grafts(
            self.base,
            self.donors,
            rows,
            batch_size=self.batch_size,
            pad_id=self.pad_id,
            executor=self.executor,  # type: ignore[arg-type]
        )

    def plain(self, rows: Sequence[GraftRow]) -> torch.Tensor:
        return plain_forward(self.base, rows, self.batch_size, self.pad_id)

    def widest_batch(self, rows: Sequence[GraftRow]) -> list[GraftRow]:
        return [rows[i] for i in batches_of(rows, self.batch_size)[-1]]


def measure_times(w: Workload, repeats: int) -> dict[str, list[float]]:
    """Wall seconds per repeat of the engine and the plain forward over E1, E3 and FE+LT rows."""
    jobs = {
        "e1_engine": lambda: w.engine(w.e1),
        "e1_plain": lambda: w.plain(w.e1),
        "e3_engine": lambda: w.engine(w.e3),
        "e3_plain": lambda: w.plain(w.e3),
        "fe_lt_engine": lambda: w.engine(w.fe_lt),
    }
    times: dict[str, list[float]] = {k: [] for k in jobs}
    for _ in range(repeats):  # interleaved, so that load drifts hit both sides alike
        for name, job in jobs.items():
            times[name].append(timed(job, w.device))
    return times


def measure_paper(w: Workload, examples: int, engine_s_per_row: float) -> dict:
    """The paper's routine on the first ``examples`` FE+LT rows, against the engine per row."""
    if not examples:
        return {"examples": 0}
    rows = w.fe_lt[:examples]
    per_example, logits = [], []
    for row in rows:
        start = time.perf_counter()
        logits.append(paper_rows(w.base, w.donors, [row]))
        per_example.append(time.perf_counter() - start)
    paper_s = statistics.mean(per_example)
    return {
        "examples": len(rows),
        "graft": E1_GRAFTS["FE+LT"],
        "tokens": [len(r.input_ids) for r in rows],
        "seconds_per_example": per_example,
        "paper_s_per_example": paper_s,
        "engine_s_per_row": engine_s_per_row,
        "max_abs_diff_vs_engine": float((torch.cat(logits) - w.engine(rows)).abs().max()),
        "ratio": check("paper_over_engine_per_example", paper_s / engine_s_per_row),
    }


def fixed_costs(model: str, dtype: str | None, device: str | None) -> int:
    """RSS in bytes of what any use of ``model`` holds besides its weights: the interpreter,
    the libraries a load imports (torch, transformers, nnsight, modeling code) and the
    tokenizer (327 MiB for Gemma 3's 262k-token vocabulary, a few MiB for SmolLM2's). Loads
    the model once, drops its weights, measures with the tokenizer alive, then drops it too
    (the workload loads its own)."""
    import gc

    from graft.models import load_model

    loaded = load_model(model, dtype=dtype, device=device)
    tokenizer = loaded.tokenizer
    del loaded
    gc.collect()
    release_free_heap()
    held = current_rss()
    del tokenizer
    gc.collect()
    release_free_heap()
    return held


def memory_summary(
    weights: int, rss_start: int, rss_loaded: int, peak: int, activations: int | None
) -> dict:
    """Peak RSS of the timed runs against 1.25 x parameter bytes + one batch of activations,
    counted whole (``ratio``, the goal as written) and without the ``rss_start`` that the
    interpreter, libraries and tokenizer hold (:func:`fixed_costs`: what the process holds
    whatever graft does; ``ratio_without_fixed_costs``)."""
    memory: dict = {
        "param_bytes_base_plus_donor": weights,
        "rss_fixed_costs": rss_start,
        "rss_after_loading": rss_loaded,
        "peak_rss_timed_runs": peak,
        "peak_rss_method": "VmHWM after reset" if activations is not None else "lifetime peak",
        "lifetime_peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "activation_bytes_one_plain_batch": activations,
    }
    if activations is not None:
        bound = 1.25 * weights + activations
        memory["bound_bytes"] = bound
        memory["peak_over_params"] = peak / weights
        memory["ratio"] = check("peak_rss_over_bound", peak / bound)
        memory["ratio_without_fixed_costs"] = check(
            "peak_minus_fixed_costs_over_bound", (peak - rss_start) / bound
        )
    return memory


def build_workload(
    model: str,
    n_prompts: int,
    batch_size: int,
    *,
    dtype: str | None = None,
    device: str | None = None,
    seed: int = 1,
):
    """(loaded base, workload): the base, a perturbed donor and the E1/E3/FE+LT rows."""
    from graft.models import load_model

    loaded = load_model(model, dtype=dtype, device=device)
    base = loaded.model
    donor = perturbed_copy(base, seed=seed)
    workload = headline_workload(
        base, donor, loaded.tokenizer, n_prompts, batch_size, device=loaded.device
    )
    return loaded, workload


def headline_workload(
    base: nn.Module,
    donor: nn.Module,
    tokenizer,
    n_prompts: int,
    batch_size: int,
    *,
    device: torch.device,
    executor: object | None = None,
) -> Workload:
    """The E1, E3 and FE+LT rows of ``n_prompts`` headline prompts on ``base`` and ``donor``."""
    max_tokens = getattr(base.config, "max_position_embeddings", 10**9)
    prompts = headline_prompts(tokenizer, n_prompts, max_tokens)
    return Workload(
        base=base,
        donors={"sft": donor},
        prompts=prompts,
        e1=graft_rows(prompts, E1_GRAFTS),
        e3=graft_rows(prompts, E3_GRAFTS),
        fe_lt=graft_rows(prompts, {"FE+LT": E1_GRAFTS["FE+LT"]}),
        batch_size=batch_size,
        pad_id=default_pad_id(base.config),
        device=device,
        executor=executor,
    )


def run_benchmark(args: argparse.Namespace) -> dict:
    """Load, warm up, measure (a)-(d); returns the JSON-ready result."""
    import nnsight  # noqa: F401  (its import counts as held before loading, not as grafting)

    if args.threads:
        torch.set_num_threads(args.threads)
    rss_start = fixed_costs(args.model, args.dtype, args.device)
    loaded, w = build_workload(
        args.model,
        args.prompts,
        args.batch_size,
        dtype=args.dtype,
        device=args.device,
        seed=args.seed,
    )
    base, donor, prompts = w.base, w.donors["sft"], w.prompts
    rss_loaded = current_rss()

    # one batch of activations: the first forward after loading, on the widest E1 batch
    peak_reset = reset_peak_rss()
    w.plain(w.widest_batch(w.e1))
    activations = max(peak_rss() - rss_loaded, 0) if peak_reset else None
    for rows in (w.widest_batch(w.e1), w.widest_batch(w.e3)):  # warm-up
        w.engine(rows)
        w.plain(rows)

    if w.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(w.device)
    reset_peak_rss()
    times = measure_times(w, args.repeats)
    peak = peak_rss()
    cuda_peak = torch.cuda.max_memory_allocated(w.device) if w.device.type == "cuda" else None
    med = {k: statistics.median(v) for k, v in times.items()}

    pre_rows = graft_rows(prompts, {"PRE": "none"})
    pre_diff = float((w.engine(pre_rows) - w.plain(pre_rows)).abs().max())
    paper = measure_paper(w, args.paper_examples, med["fe_lt_engine"] / len(w.fe_lt))
    memory = memory_summary(
        param_bytes(base) + param_bytes(donor), rss_start, rss_loaded, peak, activations
    )
    memory["cuda_max_allocated"] = cuda_peak
    n1, n3 = len(w.e1), len(w.e3)
    model_info = loaded.describe() | {"arch": architecture_of(base).family}
    return {
        "environment": environment(w.device, model_info, args.argv),
        "settings": {
            "prompts": len(prompts),
            "batch_size": args.batch_size,
            "repeats": args.repeats,
            "seed": args.seed,
            "prompt_tokens": sorted({len(p.input_ids) for p in prompts}),
            "example_prompt": prompts[0].text,
            "e1_grafts": E1_GRAFTS,
            "e3_grafts": E3_GRAFTS,
        },
        "times_s": times,
        "medians_s": med,
        "rows": {"e1": n1, "e3": n3, "fe_lt": len(w.fe_lt)},
        "rows_per_s": {
            "e1_engine": n1 / med["e1_engine"],
            "e1_plain": n1 / med["e1_plain"],
            "e3_engine": n3 / med["e3_engine"],
            "e3_plain": n3 / med["e3_plain"],
        },
        "e1": check("e1_engine_over_plain", med["e1_engine"] / med["e1_plain"]),
        "e3": check("e3_engine_over_plain", med["e3_engine"] / med["e3_plain"]),
        "paper": paper,
        "memory": memory,
        "pre_engine_vs_plain_max_abs_diff": pre_diff,
    }


def _verdict(result: dict) -> str:
    return f"{result['value']:.3g} (goal {result['goal']}): {'PASS' if result['pass'] else 'FAIL'}"


def report(res: dict) -> str:
    """Human-readable lines of a result."""
    env, st, med, rows = res["environment"], res["settings"], res["medians_s"], res["rows"]
    lines = [
        f"{env['model']['name']} ({env['model']['dtype']}) on {env['device']}, "
        f"{env['torch_threads']} threads; {st['prompts']} prompts, batch {st['batch_size']}, "
        f"median of {st['repeats']}",
        f"(a) E1 position mix, {rows['e1']} rows: engine {med['e1_engine']:.2f} s, plain "
        f"{med['e1_plain']:.2f} s, engine/plain {_verdict(res['e1'])}",
        f"    rows/s: engine {res['rows_per_s']['e1_engine']:.1f}, plain "
        f"{res['rows_per_s']['e1_plain']:.1f}",
        f"(b) E3 component mix at LT, {rows['e3']} rows: engine {med['e3_engine']:.2f} s, plain "
        f"{med['e3_plain']:.2f} s, engine/plain {_verdict(res['e3'])}",
    ]
    paper = res["paper"]
    if paper["examples"]:
        lines.append(
            f"(c) paper routine, {paper['examples']} FE+LT example(s): "
            f"{paper['paper_s_per_example']:.3f} s/example vs engine "
            f"{paper['engine_s_per_row'] * 1e3:.1f} ms/row (batch {st['batch_size']}), "
            f"paper/engine {_verdict(paper['ratio'])}; max |diff| "
            f"{paper['max_abs_diff_vs_engine']:.1e}"
        )
    else:
        lines.append("(c) paper routine: skipped (--paper-examples 0)")
    mem = res["memory"]
    if "ratio" in mem:
        lines.append(
            f"(d) peak RSS {mem['peak_rss_timed_runs'] / MIB:,.0f} MiB for "
            f"{mem['param_bytes_base_plus_donor'] / MIB:,.0f} MiB of parameters "
            f"({mem['peak_over_params']:.2f}x; {mem['rss_fixed_costs'] / MIB:,.0f} MiB of "
            f"interpreter, libraries and tokenizer, {mem['rss_after_loading'] / MIB:,.0f} MiB "
            f"after), bound 1.25 x params + {mem['activation_bytes_one_plain_batch'] / MIB:,.0f}"
            f" MiB activations = {mem['bound_bytes'] / MIB:,.0f} MiB: peak/bound "
            f"{_verdict(mem['ratio'])}; (peak - fixed costs)/bound "
            f"{_verdict(mem['ratio_without_fixed_costs'])}"
        )
    else:
        lines.append(f"(d) peak RSS (lifetime): {mem['peak_rss_timed_runs'] / MIB:,.0f} MiB")
    if mem["cuda_max_allocated"] is not None:
        lines.append(f"    CUDA max allocated {mem['cuda_max_allocated'] / MIB:,.0f} MiB")
    lines.append(
        f"PRE via the engine vs plain: max |diff| {res['pre_engine_vs_plain_max_abs_diff']:.1e}"
    )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.real_model", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--model", default="smollm2-135m", help="registry name or model folder")
    ap.add_argument("--prompts", type=int, default=32, help="headline prompts (rows = 8 x this)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats (median reported)")
    ap.add_argument(
        "--paper-examples", type=int, default=2, help="FE+LT examples for the paper routine"
    )
    ap.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16", "float16"],
        help="default: float32 on the CPU, bfloat16 on CUDA",
    )
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the donor's noise")
    ap.add_argument("--json", type=Path, default=None, help="write every number here")
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    for name in ("prompts", "batch_size", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.paper_examples < 0 or args.paper_examples > args.prompts:
        ap.error("--paper-examples must be between 0 and --prompts")
    if args.threads < 0:
        ap.error("--threads must be 0 (torch's default) or more")
    if args.device is not None:
        try:
            device = torch.device(args.device)
        except RuntimeError:
            ap.error(f"--device {args.device!r} is not a device; use cpu or cuda")
        if device.type == "cuda" and not torch.cuda.is_available():
            ap.error("--device cuda: this machine has no CUDA device; use --device cpu")
    if args.json is not None and args.json.is_dir():
        ap.error(f"--json {args.json} is a folder; give a file name such as out.json")
    return args


@torch.no_grad()
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = run_benchmark(args)
    except GraftError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(report(result))
    if args.json is not None:
        write_json(args.json, result)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
