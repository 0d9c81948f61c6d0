"""The floor of shared-prefix grafting at the last token, with plain forwards only.

A graft of the last token (E3's component sets, E4, layer maps at LT) changes nothing before
it, so every row of one prompt shares the base's prefix. This times, over the same rows
(``--grafts`` rows per headline prompt, as in E3):

- plain: one full batched forward of the base per row (what the E3 ratio divides by);
- prefix + step: each prompt's prefix (all tokens but the last) once with a KV cache, the
  cache repeated for the prompt's rows, then one single-token step per row. ``--group``
  prompts share one prefix forward and their rows one step forward: on a CPU each forward
  streams every weight once, so few wide forwards beat many narrow ones.

``prefix + step / plain`` is what the E3 ratio can reach when the engine shares prefixes and
grafts only in the step (the donor's modules at the last token come on top: at most one
token per row through the grafted layers). The two ways' logits are compared too: left
padding, explicit positions and the cache must give the plain forward's logits.

Run from the repository root::

    python -m benchmarks.prefix_floor [--model smollm2-135m] [--prompts 32] [--batch-size 32]
        [--grafts 8] [--group 32] [--repeats 3] [--random-weights] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache

from benchmarks._graft_api import cache_argument, default_pad_id
from benchmarks.cli import benchmark_parser
from benchmarks.measure import timed, write_json
from benchmarks.workload import Prompt, graft_rows, headline_prompts, plain_forward


def _left_pad(seqs: Sequence[Sequence[int]], pad_id: int):
    """(ids, attention mask, position ids), each [len(seqs), widest], padded on the left."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    pos = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s) :] = torch.as_tensor(list(s))
        mask[i, width - len(s) :] = 1
        pos[i, width - len(s) :] = torch.arange(len(s))
    return ids, mask, pos


@torch.no_grad()
def prefix_and_step(
    model: nn.Module, prompts: Sequence[Prompt], repeats: int, group: int, pad_id: int
) -> torch.Tensor:
    """Last-token logits, ``repeats`` rows per prompt (prompt-major): shared prefix, then a step.

    ``group`` prompts share one prefix forward; their ``group * repeats`` rows share one step.
    """
    device = next(model.parameters()).device
    out = []
    for start in range(0, len(prompts), group):
        chunk = prompts[start : start + group]
        ids, mask, pos = _left_pad([p.input_ids[:-1] for p in chunk], pad_id)
        cache = DynamicCache(config=model.config)
        model(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            position_ids=pos.to(device),
            use_cache=True,
            **{cache_argument(model): cache},
            logits_to_keep=1,
        )
        cache.batch_repeat_interleave(repeats)
        last = torch.tensor([[p.input_ids[-1]] for p in chunk]).repeat_interleave(repeats, 0)
        step_pos = torch.tensor([[len(p.input_ids) - 1] for p in chunk])
        step_mask = torch.cat([mask, torch.ones((len(chunk), 1), dtype=torch.long)], dim=1)
        logits = model(
            input_ids=last.to(device),
            attention_mask=step_mask.repeat_interleave(repeats, 0).to(device),
            position_ids=step_pos.repeat_interleave(repeats, 0).to(device),
            use_cache=True,
            **{cache_argument(model): cache},
            logits_to_keep=1,
        ).logits[:, -1]
        out.append(logits.float().cpu() if logits.dtype != torch.float64 else logits.cpu())
    return torch.cat(out)


def add_random_weights(ap: argparse.ArgumentParser) -> None:
    """``--random-weights``, which :func:`_model_and_tokenizer` reads."""
    ap.add_argument(
        "--random-weights",
        action="store_true",
        help="the model's architecture with random weights (same cost, no weight loading)",
    )


def model_record(args: argparse.Namespace, n_prompts: int) -> dict[str, Any]:
    """The run's model as its JSON records it: ``model``, ``random_weights`` (read by
    :func:`_model_and_tokenizer`) and ``prompts`` (``n_prompts``, those measured)."""
    return {"model": args.model, "random_weights": args.random_weights, "prompts": n_prompts}


def _model_and_tokenizer(name: str, random_weights: bool):
    """The model (or, with ``random_weights``, one of its architecture with random weights)."""
    from graft.models import load_model

    if not random_weights:
        loaded = load_model(name, device="cpu")
        return loaded.model, loaded.tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from graft.models import ensure_embedded, resolve_model_name

    source, location = resolve_model_name(name)
    if source == "tiny":
        loaded = load_model(name, device="cpu")
        return loaded.model, loaded.tokenizer
    folder = ensure_embedded(location) if source == "embedded" else location
    config = AutoConfig.from_pretrained(folder)
    model = AutoModelForCausalLM.from_config(config).float().eval()
    return model, AutoTokenizer.from_pretrained(folder)


@torch.no_grad()
def main(argv: Sequence[str] | None = None) -> int:
    ap = benchmark_parser("benchmarks.prefix_floor", __doc__)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=32, help="rows per step (and plain) batch")
    ap.add_argument("--grafts", type=int, default=8, help="rows per prompt (E3 has 8)")
    ap.add_argument("--group", type=int, default=32, help="prompts per prefix (and step) forward")
    ap.add_argument("--repeats", type=int, default=3)
    add_random_weights(ap)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if min(args.prompts, args.batch_size, args.grafts, args.group, args.repeats) < 1:
        ap.error("--prompts, --batch-size, --grafts, --group and --repeats must be at least 1")
    model, tokenizer = _model_and_tokenizer(args.model, args.random_weights)
    pad_id = default_pad_id(model.config)
    max_tokens = getattr(model.config, "max_position_embeddings", 10**9)
    prompts = headline_prompts(tokenizer, args.prompts, max_tokens)
    rows = graft_rows(prompts, {f"g{i}": "none" for i in range(args.grafts)})
    device = next(model.parameters()).device

    def plain():
        return plain_forward(model, rows, args.batch_size, pad_id)

    def shared():
        return prefix_and_step(model, prompts, args.grafts, args.group, pad_id)

    # plain_forward sorts rows by length; compare in row order
    diff = float((plain() - shared()).abs().max())  # also the warm-up
    t_plain, t_shared = [], []
    for _ in range(args.repeats):
        t_plain.append(timed(plain, device))
        t_shared.append(timed(shared, device))
    p, s = statistics.median(t_plain), statistics.median(t_shared)
    print(
        f"{args.model}{' (random weights)' if args.random_weights else ''}, {len(prompts)} "
        f"prompts x {args.grafts} rows, batch {args.batch_size} (plain), {args.group} prompts "
        f"per prefix, {torch.get_num_threads()} "
        f"threads, median of {args.repeats}: plain {p:.2f} s, prefix + step {s:.2f} s, "
        f"ratio {s / p:.2f}; max |diff| {diff:.1e}"
    )
    if args.json is not None:
        write_json(
            args.json,
            {
                **model_record(args, len(prompts)),
                "grafts": args.grafts,
                "batch_size": args.batch_size,
                "group": args.group,
                "threads": torch.get_num_threads(),
                "plain_s": t_plain,
                "prefix_step_s": t_shared,
                "ratio": s / p,
                "max_abs_diff": diff,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
