"""How :mod:`benchmarks.paper_scale` reports a result: a markdown table row
(:func:`report_line` under :data:`TABLE_HEAD`) and a row of its ``paper_scale.csv``
(:func:`csv_row`)."""

from __future__ import annotations

from benchmarks.measure import MIB

#: The paper shapes' goals (a result without its own ``goals`` has these).
GOALS = {"e1": 1.1, "e3": 0.4, "peak": 1.0}
#: The goals of a host-bound proxy (``--width``): a narrow model's plain forward is almost
#: all per-operation host work, as a GPU forward of short rows is.
PROXY_GOALS = {"e1": 1.3, "e3": 0.6, "peak": 1.0}


def report_line(res: dict) -> str:
    """One table row of a result (markdown)."""
    m, r, mem = res["environment"]["model"], res["rows_per_s"], res["memory"]
    ok = res["pass"]

    def mark(key: str) -> str:
        return " **FAIL**" if ok[key] is False else ""

    goals = res.get("goals", GOALS)
    return (
        f"| {m['shape']} | {m['layers']} x {m.get('width', '')} | {m['params'] / 1e9:.3f} B "
        f"| {m['dtype']} "
        f"| {res['e1_engine_over_plain']:.2f} (<= {goals['e1']}){mark('e1')} "
        f"| {r['e1_engine']:.1f} / {r['e1_plain']:.1f} "
        f"| {res['e3_engine_over_plain']:.2f} (<= {goals['e3']}){mark('e3')} "
        f"| {mem['peak_timed_runs'] / MIB:,.0f} MiB "
        f"| {mem['param_bytes_base_plus_donor'] / MIB:,.0f} MiB "
        f"| {mem['peak_over_bound']:.2f}{mark('peak')} |"
    )


TABLE_HEAD = (
    "| shape | layers x width | params | dtype | E1 engine/plain (goal) | E1 rows/s engine / plain "
    "| E3 engine/plain (goal) | peak | base + donor | peak / bound (<= 1) |\n"
    "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"
)


def csv_row(res: dict, machine: str) -> dict:
    """One result as a row of ``paper_scale.csv``: the machine (:func:`machine_label`), the
    shape, the three ratios against their goals and what they are made of."""
    m, r, mem, ok = res["environment"]["model"], res["rows_per_s"], res["memory"], res["pass"]
    settings = res["settings"]
    return {
        "machine": machine,
        "shape": m["shape"],
        "layers": m["layers"],
        "width": m.get("width"),
        "params": m["params"],
        "dtype": m["dtype"],
        "e1_engine_over_plain": res["e1_engine_over_plain"],
        "e3_engine_over_plain": res["e3_engine_over_plain"],
        "peak_over_bound": mem["peak_over_bound"],
        "pass_e1": ok["e1"],
        "pass_e3": ok["e3"],
        "pass_peak": ok["peak"],
        "goal_e1": res.get("goals", GOALS)["e1"],
        "goal_e3": res.get("goals", GOALS)["e3"],
        "e1_rows_per_s_engine": r["e1_engine"],
        "e1_rows_per_s_plain": r["e1_plain"],
        "peak_bytes": mem["peak_timed_runs"],
        "param_bytes_base_plus_donor": mem["param_bytes_base_plus_donor"],
        "prompts": settings["prompts"],
        "batch_size": settings["batch_size"],
        "repeats": settings["repeats"],
        "date_utc": res["environment"]["date_utc"],
    }
