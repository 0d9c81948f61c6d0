"""Where the engine's time goes on the E1 position mix: per graft, and per kind of work.

Run from the repository root::

    python -m benchmarks.profile_engine [--model smollm2-135m] [--prompts 16] [--batch-size 16]
    python -m benchmarks.profile_engine --proxy llama3.2-1b:16 --prompts 32 --batch-size 32

(``--proxy SHAPE:LAYERS``: the host-bound proxy of ``benchmarks.paper_scale --width``, a
random model of a paper shape at that depth and ``--width`` 64, one thread by default.)

Three views, one short run (warm-up first):

1. per graft: the engine over one graft's rows vs a plain batched forward over the same rows
   (PRE, a graft of nothing, is the engine's fixed cost; SFT and the complements show what
   running base and donor on the same cells costs);
2. a sampled profile of the engine over all E1 rows. A thread samples the main thread's
   Python stack every ``--interval`` ms (nnsight runs the trace body in greenlets on the
   main thread, which deterministic profilers misattribute). Each sample is put in one
   bucket: planning (spec resolution, masks), base forward compute, donor module calls,
   gather / scatter / clone in the trace body, nnsight on the worker side (envoy access),
   nnsight on the model side (hooks, interleaving, trace setup), module-call machinery,
   other;
3. planning timed alone: ``run_grafts`` over the E1 and the E3 rows with an executor that
   plans every batch and runs none (:class:`PlanOnly`), against the engine's own time over
   the same rows (medians of ``--plan-repeats``): the checks, routing and every batch's
   plan, without the work an executor does per batch (module tables, split products).
"""

from __future__ import annotations

import collections
import linecache
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.cli import benchmark_parser
from benchmarks.measure import timed, write_json
from benchmarks.paper_scale import load_tokenizer
from benchmarks.paper_shapes import PROXY_HEAD_DIM, random_workload
from benchmarks.workload import E1_GRAFTS, E3_GRAFTS, build_workload, graft_rows
from graft.core import LocalExecutor, run_grafts
from graft.models import PAPER_CONFIGS

_PLANNING = {
    "checked_inputs",
    "route_rows",
    "prefix_plans",
    "plan_batch",
    "resolve_rows",
    "check_compatible",
    "donor_modules",
    "resolve",
}

Frame = tuple[str, str, int]  # (file, function, line)


class StackSampler:
    """Samples one thread's Python stack at a fixed interval from a background thread.

    Args:
        interval: seconds between samples.
    """

    def __init__(self, interval: float = 0.002):
        self.interval = interval
        self.samples: list[list[Frame]] = []
        self._target = threading.get_ident()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> StackSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            frame = sys._current_frames().get(self._target)
            stack: list[Frame] = []
            while frame is not None:
                code = frame.f_code
                stack.append((code.co_filename, code.co_name, frame.f_lineno))
                frame = frame.f_back
            self.samples.append(stack)  # innermost first


def _area(filename: str) -> str:
    for name in ("nnsight", "transformers", "torch", "graft", "benchmarks"):
        if f"/{name}/" in filename:
            return name
    return "other"


def _trace_body_bucket(stack: list[Frame], index: int) -> str:
    """Bucket of a sample taken inside the engine's trace body (frame ``index``)."""
    filename, _, lineno = stack[index]
    line = linecache.getline(filename, lineno)
    deeper = {_area(f) for f, _, _ in stack[:index]}
    copying = "gather / scatter / clone in trace body"
    if "module(" in line and any(t in line for t in ("x[rows]", "_take(x, rows", "_take_once(")):
        return "donor module calls" if deeper - {"graft"} else copying
    if "type(module).forward" in line:  # a split module's own weights on the other cells
        return "base forward compute" if deeper - {"graft"} else copying
    if any(op in line for op in ("merge_slices(", "_put(", "_take(", "_take_once(", "new_empty(")):
        return copying
    if "nnsight" in deeper:
        return "nnsight, worker side (envoy inputs/outputs)"
    if not deeper:
        return "gather / scatter / clone in trace body"
    return "engine trace body, other"


def bucket(stack: list[Frame]) -> str:
    """The kind of work one sampled stack (innermost first) was doing."""
    names = [func for _, func, _ in stack]
    areas = [_area(f) for f, _, _ in stack]
    for i, (_, func, _) in enumerate(stack):
        if areas[i] == "graft" and func in _PLANNING:
            return "planning (spec resolution, masks, checks)"
        if func in ("graft_trace_body", "_graft_module"):
            return _trace_body_bucket(stack, i)
    if "run_plan" not in names:
        return "outside run_plan (batching loop, results)"
    leaf_file, leaf_func, _ = stack[0]
    if areas[0] == "torch" and leaf_file.endswith("nn/modules/module.py"):
        return "module-call machinery (hooks, _call_impl)"
    if areas[0] in ("torch", "transformers"):
        return "base forward compute"
    if "nnsight" in areas:
        return "nnsight, model side (hooks, interleaving, trace setup)"
    return "engine, other"


def summarize(samples: list[list[Frame]], top: int = 15) -> dict:
    """Shares per bucket, top leaf functions (self) and top graft/nnsight functions (inclusive)."""
    n = max(len(samples), 1)
    buckets = collections.Counter(bucket(s) for s in samples)
    leaves = collections.Counter(
        f"{Path(s[0][0]).parent.name}/{Path(s[0][0]).name}:{s[0][1]}" for s in samples if s
    )
    inclusive: collections.Counter = collections.Counter()
    for s in samples:
        seen = {
            f"{_area(f)}/{Path(f).name}:{func}"
            for f, func, _ in s
            if _area(f) in ("graft", "nnsight")
        }
        inclusive.update(seen)
    return {
        "samples": len(samples),
        "buckets": {k: v / n for k, v in buckets.most_common()},
        "top_self": {k: v / n for k, v in leaves.most_common(top)},
        "top_inclusive_graft_nnsight": {k: v / n for k, v in inclusive.most_common(top)},
    }


def per_graft(w, grafts: dict[str, str], repeats: int = 1) -> dict[str, dict[str, float]]:
    """Median engine and plain seconds over each graft's rows (after the warm-up)."""
    out = {}
    for name, text in grafts.items():
        rows = graft_rows(w.prompts, {name: text})
        engine, plain = [], []
        for _ in range(repeats):  # interleaved, like the benchmark
            engine.append(timed(lambda rows=rows: w.engine(rows), w.device))
            plain.append(timed(lambda rows=rows: w.plain(rows), w.device))
        e, p = statistics.median(engine), statistics.median(plain)
        out[name] = {"engine_s": e, "plain_s": p, "ratio": e / p}
    return out


class PlanOnly(LocalExecutor):
    """A :class:`graft.core.LocalExecutor` that plans every batch and runs none: each plan's
    rows come back as one zero logit, so :func:`graft.core.run_grafts` with it costs the
    engine's planning alone (checks, routing, every batch's plan, collecting the rows)."""

    def run(self, base, donors, plans):
        for plan in plans:
            yield torch.zeros((plan.input_ids.shape[0], 1))


def planning_alone(w, rows, repeats: int) -> dict[str, float]:
    """Median wall seconds of the engine over ``rows`` and of its planning alone
    (:class:`PlanOnly`), the plans kept across calls as in a run (a warm-up call first)."""
    plan_only = PlanOnly()

    def planned() -> object:
        return run_grafts(
            w.base, w.donors, rows, batch_size=w.batch_size, pad_id=w.pad_id, executor=plan_only
        )

    planned()
    w.engine(rows)
    plan_s = statistics.median(timed(planned, w.device) for _ in range(repeats))
    engine_s = statistics.median(timed(lambda: w.engine(rows), w.device) for _ in range(repeats))
    return {"planning_s": plan_s, "engine_s": engine_s, "share": plan_s / engine_s}


def proxy_workload(proxy: str, width: int, prompts: int, batch_size: int, tokenizer):
    """The host-bound proxy's workload (``benchmarks.paper_scale --width``): a random model
    of paper shape ``proxy`` (``NAME:LAYERS``) at hidden size ``width``, on the CPU, with a
    noisy copy as its donor."""
    name, _, layers = proxy.partition(":")
    tok = load_tokenizer(tokenizer)
    cpu = torch.device("cpu")
    return random_workload(name, torch.float32, cpu, int(layers), width, tok, prompts, batch_size)


def profile(fn: Callable[[], object], interval: float) -> tuple[float, dict]:
    """Wall seconds of one call of ``fn`` under the sampler, and the summary."""
    start = time.perf_counter()
    with StackSampler(interval) as sampler:
        fn()
    return time.perf_counter() - start, summarize(sampler.samples)


def _print_shares(title: str, shares: dict[str, float]) -> None:
    print(title)
    for name, share in shares.items():
        print(f"  {share * 100:5.1f}%  {name}")


@torch.no_grad()
def main(argv: list[str] | None = None) -> int:
    ap = benchmark_parser("benchmarks.profile_engine", __doc__)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--interval", type=float, default=2.0, help="sampling interval, ms")
    ap.add_argument("--repeats", type=int, default=1, help="per-graft timings: median of this")
    ap.add_argument("--no-e3", action="store_true", help="skip the per-graft E3 timings")
    ap.add_argument(
        "--plan-repeats", type=int, default=20, help="planning timed alone: median of this"
    )
    ap.add_argument(
        "--proxy",
        default=None,
        help="the host-bound proxy instead of --model: a paper shape at a depth, NAME:LAYERS "
        "(such as llama3.2-1b:16)",
    )
    ap.add_argument("--width", type=int, default=64, help="the proxy's hidden size")
    ap.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: 1 with --proxy)"
    )
    ap.add_argument("--tokenizer", default=None, help="the proxy's tokenizer (default SmolLM2's)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if min(args.prompts, args.batch_size, args.repeats, args.plan_repeats) < 1:
        ap.error("--prompts, --batch-size, --repeats and --plan-repeats must be at least 1")
    if args.interval <= 0:
        ap.error("--interval must be above 0")
    if args.proxy is not None:
        name, _, layers = args.proxy.partition(":")
        if name not in PAPER_CONFIGS or not layers.isdigit() or int(layers) < 1:
            ap.error(
                f"--proxy {args.proxy!r}: write NAME:LAYERS, NAME one of "
                f"{', '.join(PAPER_CONFIGS)} (such as llama3.2-1b:16)"
            )
        if args.width < PROXY_HEAD_DIM or args.width % PROXY_HEAD_DIM:
            ap.error(f"--width must be a multiple of {PROXY_HEAD_DIM}, such as 64")
        if args.threads is None:
            args.threads = 1
    if args.threads is not None:
        if args.threads < 1:
            ap.error("--threads must be at least 1")
        torch.set_num_threads(args.threads)
    if args.proxy is not None:
        label = f"proxy {args.proxy} x d {args.width}"
        w = proxy_workload(args.proxy, args.width, args.prompts, args.batch_size, args.tokenizer)
    else:
        label = args.model
        _, w = build_workload(args.model, args.prompts, args.batch_size)
    w.engine(w.widest_batch(w.e1))  # warm-up
    w.plain(w.widest_batch(w.e1))
    plain_s = timed(lambda: w.plain(w.e1), w.device)
    engine_s, summary = profile(lambda: w.engine(w.e1), args.interval / 1e3)
    grafts = per_graft(w, E1_GRAFTS | ({} if args.no_e3 else E3_GRAFTS), args.repeats)
    planning = {"e1": planning_alone(w, w.e1, args.plan_repeats)}
    if not args.no_e3:
        planning["e3"] = planning_alone(w, w.e3, args.plan_repeats)
    print(
        f"{label}, {args.prompts} prompts, batch {args.batch_size}, "
        f"{torch.get_num_threads()} threads; E1 {len(w.e1)} rows: engine {engine_s:.2f} s "
        f"(sampled, {summary['samples']} samples), plain {plain_s:.2f} s"
    )
    _print_shares("engine time by kind of work (E1 mix):", summary["buckets"])
    _print_shares("top functions, self:", summary["top_self"])
    _print_shares("top graft/nnsight functions, inclusive:", summary["top_inclusive_graft_nnsight"])
    print("per graft (engine / plain over the same rows):")
    for name, t in grafts.items():
        print(f"  {name:12s} {t['engine_s']:7.3f} s / {t['plain_s']:7.3f} s = {t['ratio']:5.2f}")
    print(f"planning timed alone (medians of {args.plan_repeats}; no forward, no executor work):")
    for mix, t in planning.items():
        print(
            f"  {mix.upper()} {len(getattr(w, mix))} rows: planning {t['planning_s'] * 1e3:7.1f} ms"
            f" of the engine's {t['engine_s'] * 1e3:7.1f} ms ({t['share'] * 100:4.1f}%)"
        )
    if args.json is not None:
        result = {
            "model": label,
            "prompts": args.prompts,
            "batch_size": args.batch_size,
            "threads": torch.get_num_threads(),
            "repeats": args.repeats,
            "e1_engine_s_sampled": engine_s,
            "e1_plain_s": plain_s,
            "profile": summary,
            "per_graft": grafts,
            "planning_alone": planning,
        }
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
