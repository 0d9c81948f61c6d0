import torch, time, statistics, sys
from benchmarks.real_model import build_workload, graft_rows, E1_GRAFTS
torch.set_num_threads(2)
loaded, w = build_workload("smollm2-135m", 32, 32, dtype="float32", device="cpu", seed=0)
def wall(fn, rows, n=3):
    fn(rows); ts=[]
    for _ in range(n):
        t=time.perf_counter(); fn(rows); ts.append(time.perf_counter()-t)
    return statistics.median(ts)
for names in (["PRE","SFT","LT","LT^C"], ["FE","FE+LT","(FE+LT)^C","FE^C"], list(E1_GRAFTS)):
    rows = graft_rows(w.prompts, {n: E1_GRAFTS[n] for n in names})
    e, p = wall(w.engine, rows), wall(w.plain, rows)
    print(names, "engine %.3f plain %.3f ratio %.2f" % (e, p, e/p))
