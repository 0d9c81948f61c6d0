"""graft's memory plan (:mod:`graft.study.planning.memory`) against measured peaks.

Run from the repository root, one measurement per process (so its peak is its own)::

    python -m benchmarks.plan_check train --model smollm2-135m --precision float32 \\
        --batch-size 16 --seq-len 40 --steps 3 [--layers N] [--gradient-checkpointing] \\
        [--device cpu|cuda] [--json out.json]
    python -m benchmarks.plan_check forward --model gpt2-xl --dtype bfloat16 --batch-size 32 \\
        --seq-len 20 [--donors 1] [--layers N] [--device cpu|cuda]
    python -m benchmarks.plan_check finetune --model smollm2-135m [--max-steps 20] [--workspace WS]
    python -m benchmarks.plan_check position --model smollm2-135m --workspace WS

``train``: random weights of the model's config (a paper model's published shape from
:mod:`graft.models.paper`, at ``--layers`` if given; any other name's config as graft finds
it), ``--steps`` AdamW steps on random tokens as graft's finetune takes them (fused AdamW,
``mixed``: float32 weights under bfloat16 autocast; ``bfloat16``: weights, gradients and
state in bfloat16), with the activations autograd saved (counted by the same hooks the plan
traces with). ``forward``: the base and ``--donors`` copies held, one plain forward pass of
the base without gradients, last-position logits only (the grafting plan's floor: the
engine's own work is not in it). ``finetune``: graft's own finetune (the Trainer) of the
model on a generated dataset (in ``--workspace``, else a temporary one), the preset's steps
or ``--max-steps``.
``position``: ``graft-exp position`` on a workspace that holds its donor. Each prints the
measured peak (CUDA max allocated above what was allocated before; on the CPU the peak
resident set above the one before the model was built or loaded), the plan's peak and their
ratio; ``finetune`` and ``position`` take the plan that ``--dry-run`` prints.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

from benchmarks.cli import benchmark_parser
from benchmarks.measure import (
    MIB,
    current_rss,
    peak_rss,
    release_free_heap,
    reset_peak_rss,
)

PRECISIONS = ("float32", "mixed", "bfloat16")


def model_config(name: str, layers: int | None):
    """The config of ``name`` (a paper model's published one, else as graft finds it), with
    ``layers`` decoder layers if given."""
    from graft.models import PAPER_CONFIGS

    if name in PAPER_CONFIGS:
        config = PAPER_CONFIGS[name]()
    else:
        from graft.models import model_config as find

        found = find(name)
        if found is None:
            raise SystemExit(f"no config of {name} on this machine")
        config = found.config
    if layers is not None:
        config.get_text_config().num_hidden_layers = layers
    return config


class Peak:
    """The peak above what was held when it was made: CUDA max allocated on a GPU, the peak
    resident set (VmHWM) on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        gc.collect()
        release_free_heap()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            self.before = torch.cuda.memory_allocated(device)
        else:
            self.before = current_rss()
            reset_peak_rss()

    def bytes(self) -> int:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device) - self.before
        return peak_rss() - self.before


def random_model(config, dtype: torch.dtype, device: torch.device):
    """A random-weight causal LM of ``config`` (seed 0), built on ``device`` in ``dtype``."""
    import transformers

    torch.manual_seed(0)
    with torch.device(device):
        return transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)


@contextlib.contextmanager
def counting_saved(model: torch.nn.Module, into: dict[int, int]) -> Iterator[None]:
    """Count the bytes of the non-weight tensors autograd saves inside (by storage)."""
    weights = {p.untyped_storage()._cdata for p in model.parameters()}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage._cdata not in weights:
            into[storage._cdata] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield


def train_steps(
    model: torch.nn.Module,
    *,
    precision: str,
    batch_size: int,
    seq_len: int,
    steps: int,
    device: torch.device,
    saved: dict[int, int] | None = None,
) -> list[float]:
    """Seconds of each of ``steps`` fused AdamW steps (lr 2e-5, weight decay 0.01) on random
    tokens; ``mixed`` autocasts the forward and backward to bfloat16. The first step
    allocates the optimizer state; ``saved``, when given, gets the bytes of the activations
    autograd saves in it (:func:`counting_saved`)."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01, fused=True)
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.get_text_config().vocab_size
    seconds = []
    for step in range(steps):
        ids = torch.randint(0, vocab, (batch_size, seq_len), generator=generator).to(device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        autocast = torch.autocast(device.type, torch.bfloat16, enabled=precision == "mixed")
        counting = (
            contextlib.nullcontext()
            if saved is None
            else counting_saved(model, saved if step == 0 else {})
        )
        with autocast, counting:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - start)
    return seconds


def train_as_asked(
    model, args: argparse.Namespace, saved: dict[int, int] | None = None
) -> list[float]:
    """:func:`train_steps` with the command's ``--gradient-checkpointing``, ``--precision``,
    ``--batch-size``, ``--seq-len``, ``--steps`` and ``--device``."""
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return train_steps(
        model,
        precision=args.precision,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        steps=args.steps,
        device=torch.device(args.device),
        saved=saved,
    )


def train(args: argparse.Namespace) -> dict:
    """``--steps`` AdamW steps on random tokens; the peak and the saved activations."""
    from graft.study import estimate_finetune_bytes

    device = torch.device(args.device)
    config = model_config(args.model, args.layers)
    peak = Peak(device)
    dtype = torch.bfloat16 if args.precision == "bfloat16" else torch.float32
    model = random_model(config, dtype, device)
    saved: dict[int, int] = {}
    seconds = train_as_asked(model, args, saved)
    plan = estimate_finetune_bytes(
        config,
        dtype=args.precision,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        gradient_checkpointing=args.gradient_checkpointing,
    )
    return {
        "measured_peak_bytes": peak.bytes(),
        "measured_saved_activation_bytes": sum(saved.values()),
        "step_seconds": seconds,
        "plan": plan.__dict__,
    }


@torch.no_grad()
def forward(args: argparse.Namespace) -> dict:
    """The base and ``--donors`` copies held, one plain forward of the base."""
    from graft.study import estimate_grafting_bytes

    device = torch.device(args.device)
    config = model_config(args.model, args.layers)
    peak = Peak(device)
    dtype = getattr(torch, args.dtype)
    base = random_model(config, dtype, device).eval()
    donors = [copy.deepcopy(base) for _ in range(args.donors)]
    ids = torch.zeros(args.batch_size, args.seq_len, dtype=torch.long, device=device)
    base(input_ids=ids, logits_to_keep=1).logits.float().log_softmax(-1)
    plan = estimate_grafting_bytes(
        config,
        dtype=args.dtype,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        n_donors=len(donors),
    )
    return {"measured_peak_bytes": peak.bytes(), "plan": plan.__dict__}


def finetune(args: argparse.Namespace) -> dict:
    """graft's finetune of ``--model`` for ``--max-steps`` steps in a temporary workspace."""
    from graft.study import DonorRequest, Workspace, plan_finetune, resolve_config

    with tempfile.TemporaryDirectory() as tmp:
        workspace = Workspace(Path(args.workspace or tmp))
        cfg = resolve_config(args.preset, device="cpu", max_steps=args.max_steps)
        donor = workspace.locate_donor(
            DonorRequest(args.model, args.dataset, "one", cfg, n_facts=args.n_facts)
        )
        if donor.finished:
            raise SystemExit(f"{donor.path} is finetuned already: give another --workspace")
        plan = plan_finetune(
            args.model, donor.dataset_dir, cfg, device="cpu", folder=donor.path, what=args.model
        )
        peak = Peak(torch.device("cpu"))
        workspace.finetune_donor(donor, device="cpu", quiet=True)
        measured = peak.bytes()
    return {"measured_peak_bytes": measured, "plan": plan.memory.__dict__, "lines": plan.lines()}


def position(args: argparse.Namespace) -> dict:
    """``graft-exp position`` on ``--workspace`` (its donor finetuned already)."""
    from graft.study import (
        ExperimentConfig,
        ModelSource,
        RunRequest,
        plan_experiment,
        position_grafts,
        run_experiment,
    )

    with tempfile.TemporaryDirectory() as tmp:
        cfg = ExperimentConfig(
            "position",
            model=args.model,
            workspace=args.workspace,
            device="cpu",
            out=str(Path(tmp) / "run"),
            progress=False,
            finetune_max_steps=args.max_steps,
            allow_weak_donor=True,  # a memory measure: a donor of a few steps is fine
        )
        grafts = position_grafts(("FE", "LT", "FE+LT", "(FE+LT)^C", "FE^C", "LT^C"), "base")
        donors = {"sft": ModelSource("one")}
        plan = plan_experiment(RunRequest(specs=cfg, grafts=grafts, donors=donors))
        if plan.pending:
            raise SystemExit(f"{args.workspace} lacks the donor: run plan_check finetune first")
        peak = Peak(torch.device("cpu"))
        run_experiment(RunRequest(specs=cfg, grafts=grafts, donors=donors))
        measured = peak.bytes()
    assert plan.grafting is not None
    return {"measured_peak_bytes": measured, "plan": plan.grafting.__dict__, "lines": plan.lines()}


def needed(plan: dict, device: str) -> int:
    """What the plan needs of ``device`` (the CPU's heap allowance added)."""
    from graft.study import MemoryPlan, needed_bytes

    return needed_bytes(MemoryPlan(**plan), device)


COMMANDS: dict[str, Callable[[argparse.Namespace], dict]] = {
    "train": train,
    "forward": forward,
    "finetune": finetune,
    "position": position,
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = benchmark_parser("benchmarks.plan_check", __doc__)
    ap.add_argument("command", choices=list(COMMANDS))
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than published")
    ap.add_argument("--precision", default="float32", choices=PRECISIONS)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=40)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--donors", type=int, default=1)
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--preset", default="cpu")
    ap.add_argument("--dataset", default="fake_movies_real_actors")
    ap.add_argument("--n-facts", type=int, default=None)
    ap.add_argument("--max-steps", type=int, default=None, help="finetune: stop after")
    ap.add_argument("--workspace", default=None)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--json", type=Path, default=None, help="append the result here (JSONL)")
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def report(args: argparse.Namespace, result: dict) -> str:
    plan, measured = result["plan"], result["measured_peak_bytes"]
    line = (
        f"{args.command} {args.model}: measured {measured / MIB:,.0f} MiB, plan "
        f"{plan['peak_bytes'] / MIB:,.0f} MiB, measured/plan {measured / plan['peak_bytes']:.3f}"
    )
    if args.device == "cpu" and args.command != "forward":  # with the heap's allowance
        needed = result["needed_bytes"]
        line += (
            f"; needed on the CPU {needed / MIB:,.0f} MiB, measured/needed {measured / needed:.3f}"
        )
    if "measured_saved_activation_bytes" in result:
        saved = result["measured_saved_activation_bytes"]
        planned = plan["activations_bytes"] + plan["cast_bytes"]  # autocast's copies are saved
        line += f"; saved activations {saved / MIB:,.0f} MiB, plan {planned / MIB:,.0f} MiB"
    return line


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = COMMANDS[args.command](args)
    result["needed_bytes"] = needed(result["plan"], args.device)
    result["command"] = "python -m benchmarks.plan_check " + " ".join(args.argv)
    result["device"] = args.device + (
        f": {torch.cuda.get_device_name()}" if args.device == "cuda" else ""
    )
    for line in result.get("lines", []):
        print(line)
    print(report(args, result))
    if args.json is not None:  # one line per measurement, appended
        with args.json.open("a") as out:
            out.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
