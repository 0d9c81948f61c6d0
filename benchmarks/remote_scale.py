"""Ship mode at the paper's scale on the real NDIF server: one E1 batch of a random-weight
gpt2-xl, split between layers under the request limit, against the local engine.

Run from the repository root, as root (the server harness makes a network namespace), with
the server's venv built (``bash scripts/ndif/ci.sh --venv-only``), on a machine with
about 20 GB of free memory::

    .venv/bin/python -m benchmarks.remote_scale
        [--layers 48] [--dtype float32] [--prompts 2] [--max-payload-mb 448]
        [--dir /tmp/graft-remote-scale] [--json out.json]

Steps, in an order that holds at most two models in memory at once (a gpt2-xl is 6.2 GB in
float32):

1. the base (``graft.models.paper.PAPER_CONFIGS["gpt2-xl"]``, random weights, seed 0;
   ``--layers N`` keeps the width and has N layers) is saved to ``--dir`` (reused when it
   is already there);
2. the donor is ``graft.models.tiny.perturbed_copy(base)``; the base is dropped, so the client
   holds the donor only (its base is a weightless meta copy);
3. the server harness (``scripts/ndif/harness.py``) starts and deploys the saved base;
4. the E1 batch: ``--prompts`` headline prompts x the 8 E1 grafts (PRE, SFT, FE, LT, FE+LT,
   (FE+LT)^C, FE^C, LT^C) in one planned batch, in ship mode: each request's layers, donor
   bytes, bytes sent and seconds, and the batch's wall time;
5. the harness stops; the base is loaded here again and the local engine runs the same rows
   (with its shortcuts, and without: the one-pass graft a server runs); max |difference|.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import logging
import os
import sys
import time
from pathlib import Path

import torch

from benchmarks.measure import MIB, environment, peak_rss, release_free_heap, write_json
from benchmarks.workload import E1_GRAFTS, graft_rows, headline_prompts

REPO = Path(__file__).resolve().parents[1]
SERVED = "scale"  # the harness's name for the deployed base
SEED = 0


def load_harness():
    """``scripts/ndif/harness.py`` (not a package) as a module."""
    spec = importlib.util.spec_from_file_location(
        "graft_ndif_harness", REPO / "scripts" / "ndif" / "harness.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def scale_config(layers: int | None, dtype: torch.dtype):
    from graft.models import PAPER_CONFIGS

    config = PAPER_CONFIGS["gpt2-xl"]()
    if layers is not None:
        config.n_layer = layers
    config.dtype = dtype
    return config


def saved_base(folder: Path, layers: int | None, dtype: torch.dtype) -> Path:
    """The random-weight base saved in ``folder`` (built and saved unless it is there)."""
    import transformers

    from graft.models import tiny_tokenizer

    config = scale_config(layers, dtype)
    mark = folder / "graft-remote-scale.json"
    wanted = {"n_layer": config.n_layer, "dtype": str(dtype), "seed": SEED}
    if mark.exists() and json.loads(mark.read_text()) == wanted:
        return folder
    started = time.monotonic()
    torch.manual_seed(SEED)
    model = transformers.AutoModelForCausalLM.from_config(config).to(dtype).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)  # the server's TransformersModel loads one
    mark.write_text(json.dumps(wanted))
    print(f"built and saved the base in {time.monotonic() - started:.0f} s: {folder}")
    del model
    return folder


def load_base(folder: Path, dtype: torch.dtype):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()


def free() -> None:
    gc.collect()
    release_free_heap()


def e1_rows(n_prompts: int):
    from transformers import AutoTokenizer

    from graft.models import ensure_embedded

    tokenizer = AutoTokenizer.from_pretrained(str(ensure_embedded("smollm2-135m")))
    return graft_rows(headline_prompts(tokenizer, n_prompts, max_tokens=24), E1_GRAFTS)


def run_remote(folder: Path, donor, rows, args) -> dict:
    """Start the server with the saved base, run the rows in ship mode, stop the server."""
    from graft.core import run_grafts
    from graft.models import meta_model
    from graft.remote import RemoteConfig, RemoteExecutor

    harness_module = load_harness()
    harness = harness_module.Harness(Path(args.dir) / "harness", serve={SERVED: folder})
    started = time.monotonic()
    try:
        harness.start(timeout=1200.0)
        start_s = time.monotonic() - started
        cfg = RemoteConfig(
            mode="remote",
            host=harness.url,
            api_key="",
            model_key=harness.models[SERVED],
            max_payload_mb=args.max_payload_mb,
            timeout_s=1800,
            retries=0,
        )
        executor = RemoteExecutor(cfg)
        client_base = meta_model(scale_config(args.layers, args.dtype))  # no weights here
        sent = time.monotonic()
        logits = run_grafts(client_base, donor, rows, batch_size=len(rows), executor=executor)
        batch_s = time.monotonic() - sent
    finally:
        harness.stop()
    return {
        "logits": logits,
        "server_start_s": round(start_s, 1),
        "batch_s": round(batch_s, 1),
        "limit_bytes": cfg.max_payload_bytes,
        "requests": [
            {
                "block": s.block,
                "donor_bytes": s.payload,
                "sent_bytes": s.sent,
                "seconds": round(s.seconds, 2),
            }
            for s in executor.sent
        ],
        "versions": harness.versions,
    }


def run_local(folder: Path, donor, rows, dtype: torch.dtype) -> dict:
    from graft.core import LocalExecutor, run_grafts

    base = load_base(folder, dtype)
    out = {}
    for name, executor in (("shortcuts", None), ("one_pass", LocalExecutor(shortcuts=False))):
        started = time.monotonic()
        out[name] = run_grafts(base, donor, rows, batch_size=len(rows), executor=executor)
        out[f"{name}_s"] = round(time.monotonic() - started, 1)
    return out


def report(result: dict) -> None:
    limit = result["remote"]["limit_bytes"]
    print(f"\nrequest limit {limit / MIB:,.0f} MiB; {result['rows']} rows in one batch")
    print("| request | layers | donor weights | sent | seconds |")
    print("|---:|---|---:|---:|---:|")
    for i, r in enumerate(result["remote"]["requests"], 1):
        print(
            f"| {i} | {r['block']} | {r['donor_bytes'] / MIB:,.1f} MiB "
            f"| {r['sent_bytes'] / MIB:,.1f} MiB | {r['seconds']:.1f} |"
        )
    s = result["summary"]
    print(
        f"\n{s['requests']} requests, {s['sent_bytes'] / MIB:,.0f} MiB sent "
        f"({s['donor_bytes'] / MIB:,.0f} MiB of donor weights), {s['batch_s']:.0f} s for the "
        f"batch (server start {result['remote']['server_start_s']:.0f} s, not counted)"
    )
    print(
        f"max |remote - local| = {s['max_abs_diff_vs_local']:.3g} (local engine), "
        f"{s['max_abs_diff_vs_one_pass']:.3g} (local one-pass graft); local "
        f"{result['local_s']['shortcuts']:.0f} s / {result['local_s']['one_pass']:.0f} s; "
        f"peak RSS of this process {s['client_peak_rss'] / 2**30:.1f} GiB"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=None, help="layers (default: gpt2-xl's 48)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--prompts", type=int, default=2, help="headline prompts (x 8 E1 grafts)")
    ap.add_argument("--max-payload-mb", type=float, default=448.0)
    ap.add_argument("--dir", default="/tmp/graft-remote-scale", help="saved base and harness")
    ap.add_argument("--json", type=Path, default=None, help="also write the result here")
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    args.dtype = getattr(torch, args.dtype)
    logging.basicConfig(format="%(message)s")
    logging.getLogger("graft.remote").setLevel(logging.INFO)  # each request as it goes
    if os.geteuid() != 0:
        print("error: run as root: the server harness makes a network namespace", file=sys.stderr)
        return 2

    from graft.models import perturbed_copy

    folder = saved_base(Path(args.dir) / "base", args.layers, args.dtype)
    base = load_base(folder, args.dtype)
    donor = perturbed_copy(base, seed=1)
    del base
    free()
    rows = e1_rows(args.prompts)

    remote = run_remote(folder, donor, rows, args)
    free()
    local = run_local(folder, donor, rows, args.dtype)
    got = remote.pop("logits")
    requests = remote["requests"]
    result = {
        "environment": environment(
            torch.device("cpu"),
            {"shape": "gpt2-xl", "layers": scale_config(args.layers, args.dtype).n_layer},
            argv,
            module="benchmarks.remote_scale",
        ),
        "rows": len(rows),
        "dtype": str(args.dtype),
        "remote": remote,
        "local_s": {"shortcuts": local["shortcuts_s"], "one_pass": local["one_pass_s"]},
        "summary": {
            "requests": len(requests),
            "sent_bytes": sum(r["sent_bytes"] for r in requests),
            "donor_bytes": sum(r["donor_bytes"] for r in requests),
            "batch_s": remote["batch_s"],
            "max_abs_diff_vs_local": (got - local["shortcuts"]).abs().max().item(),
            "max_abs_diff_vs_one_pass": (got - local["one_pass"]).abs().max().item(),
            "client_peak_rss": peak_rss(),
        },
    }
    report(result)
    if args.json is not None:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
