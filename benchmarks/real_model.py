"""The engine on a real model against a plain batched forward, the paper's routine and memory.

Run from the repository root::

    python -m benchmarks.real_model [--model smollm2-135m] [--prompts 32] [--batch-size 32]
        [--repeats 3] [--paper-examples 2] [--json out.json] [--out results/NAME]

Workload: headline prompts ("<actor> starred in a movie with") for real actor names, the first
actor as the FE span, left padding, last-token logits; the donor is the base plus seeded
noise on every parameter (no finetune). Measured side by side in this one process, warm-up
first, medians over ``--repeats``:

(a) E1 position mix (PRE, SFT, FE, LT, FE+LT, (FE+LT)^C, FE^C, LT^C): engine time over a
    plain batched forward of the base over the same rows (same batches, same padding);
(b) E3 component mix (the paper's 8 component sets at LT, last quarter): the same ratio;
(c) the paper's routine (benchmarks.paper_routine) vs the engine per FE+LT example;
(d) peak memory (RSS; CUDA max allocated on a GPU) vs base + donor parameter bytes.

Every ratio is printed with its goal and PASS/FAIL; ``--json`` writes every number;
``--out results/NAME`` writes the ratios as ``results/NAME/real_model.csv`` (one row:
:func:`csv_row`) with their provenance in ``results/NAME/provenance.json`` (command, commit,
versions, machine, threads), which ``python -m benchmarks.results_tables`` renders where a
document marks a ``csv`` table of it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence

import torch

from benchmarks._graft_api import architecture_of, machine_info, machine_label
from benchmarks.cli import add_common_options, benchmark_parser, check_common_options
from benchmarks.measure import (
    MIB,
    current_rss,
    environment,
    param_bytes,
    peak_rss,
    reset_peak_rss,
    settings_of,
    write_json,
    write_table,
)
from benchmarks.real_model_measures import (
    check,
    fixed_costs,
    measure_paper,
    measure_times,
    memory_summary,
)
from benchmarks.workload import E1_GRAFTS, E3_GRAFTS, build_workload, graft_rows
from graft.errors import GraftError


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


def csv_row(res: dict, machine: str) -> dict:
    """One result as the row of ``real_model.csv``: the machine (:func:`machine_label`), the
    model, the ratios (None where not measured) and what they are made of."""
    env, st, mem, paper = res["environment"], res["settings"], res["memory"], res["paper"]

    def value(entry: dict | None) -> float | None:
        return None if entry is None else entry["value"]

    return {
        "machine": machine,
        "threads": env["torch_threads"],
        "model": env["model"]["name"],
        "dtype": env["model"]["dtype"],
        "e1_engine_over_plain": res["e1"]["value"],
        "e3_engine_over_plain": res["e3"]["value"],
        "paper_over_engine_per_example": value(paper.get("ratio")),
        "peak_over_bound": value(mem.get("ratio")),
        "peak_minus_fixed_costs_over_bound": value(mem.get("ratio_without_fixed_costs")),
        "e1_rows_per_s_engine": res["rows_per_s"]["e1_engine"],
        "e1_rows_per_s_plain": res["rows_per_s"]["e1_plain"],
        "paper_s_per_example": paper.get("paper_s_per_example"),
        "engine_s_per_row": paper.get("engine_s_per_row"),
        "peak_bytes": mem["peak_rss_timed_runs"],
        "fixed_cost_bytes": mem["rss_fixed_costs"],
        "param_bytes_base_plus_donor": mem["param_bytes_base_plus_donor"],
        "pre_engine_vs_plain_max_abs_diff": res["pre_engine_vs_plain_max_abs_diff"],
        "prompts": st["prompts"],
        "batch_size": st["batch_size"],
        "repeats": st["repeats"],
        "date_utc": env["date_utc"],
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
    ap = benchmark_parser("benchmarks.real_model", __doc__)
    ap.add_argument("--model", default="smollm2-135m", help="registry name or model folder")
    add_common_options(ap, "real_model", prompts=32, batch_size=32, paper_examples=2)
    ap.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16", "float16"],
        help="default: float32 on the CPU, bfloat16 on CUDA",
    )
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the donor's noise")
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.threads < 0:
        ap.error("--threads must be 0 (torch's default) or more")
    if args.device is not None:
        try:
            torch.device(args.device)
        except RuntimeError:
            ap.error(f"--device {args.device!r} is not a device; use cpu or cuda")
    check_common_options(ap, args)
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
    if args.out is not None:
        row = csv_row(result, machine_label(machine_info(args.device)))
        names = ("model", "prompts", "batch_size", "repeats", "paper_examples")
        settings = settings_of(args, *names, threads=torch.get_num_threads())
        path = write_table(args.out, "real_model", [row], args.argv, args.device, settings)
        print(f"wrote {path} and its provenance")
    return 0


if __name__ == "__main__":
    sys.exit(main())
