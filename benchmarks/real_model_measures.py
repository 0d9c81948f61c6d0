"""The measurements of :mod:`benchmarks.real_model`, each against its goal: engine and plain
forward times over the E1, E3 and FE+LT rows, the paper's routine per example, and peak
memory against the bound of the weights plus one batch of activations (what any use of the
model holds besides its weights counted apart)."""

from __future__ import annotations

import resource
import statistics
import time

import torch

from benchmarks.measure import current_rss, release_free_heap, timed
from benchmarks.paper_routine import paper_rows
from benchmarks.workload import E1_GRAFTS, Workload

GOALS = {
    "e1_engine_over_plain": ("<=", 1.2),
    "e3_engine_over_plain": ("<=", 0.5),
    "paper_over_engine_per_example": (">=", 100.0),
    "peak_rss_over_bound": ("<=", 1.0),
    "peak_minus_fixed_costs_over_bound": ("<=", 1.0),
}


def check(name: str, value: float) -> dict:
    """``value`` against the goal of ``name``: {"value", "goal", "pass"}."""
    op, goal = GOALS[name]
    ok = value <= goal if op == "<=" else value >= goal
    return {"value": value, "goal": f"{op} {goal}", "pass": bool(ok)}


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
