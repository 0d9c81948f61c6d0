"""graft.generate against the plain model's generate, with a key/value cache on both sides.

On ``--prompts`` headline prompts of different lengths (the first actor as FE), batched and
padded on the left, greedy, ``--new-tokens`` tokens each (no early stop), one timed run each
after a short warm-up:

- plain: the base's own ``model.generate(..., use_cache=True)`` on the batch;
- each graft of ``--grafts``: ``graft.generate`` of the batch under that graft (one batch,
  its cache), against a donor that is a perturbed copy of the base;
- ``--recompute`` (one graft): the same without the cache, every step recomputing the text.

It prints each time and its ratio to plain, and checks that ``none`` writes the plain
model's tokens. Run from the repository root (offline, the embedded SmolLM2-135M)::

    python -m benchmarks.generate_speed [--model smollm2-135m] [--prompts 8]
        [--new-tokens 16] [--grafts 'none|FE:all:all|...'] [--recompute LT:q4:o,ffn]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import torch

from benchmarks._graft_api import perturbed_copy
from benchmarks.cli import benchmark_parser
from benchmarks.measure import timed
from benchmarks.workload import headline_prompts

GRAFTS = "none|FE:all:all|LT:q4:o,ffn|FE+LT:all:all|ALL:all:all; head=donor"


def _plain_generate(model, prompts, new_tokens: int, pad_id: int) -> list[list[int]]:
    width = max(len(p.input_ids) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p.input_ids) :] = torch.tensor(p.input_ids)
        mask[i, width - len(p.input_ids) :] = 1
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            use_cache=True,
            pad_token_id=pad_id,
        )
    return out[:, width:].tolist()


def main(argv: Sequence[str] | None = None) -> int:
    import graft

    ap = benchmark_parser("benchmarks.generate_speed", __doc__)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument(
        "--grafts",
        default=GRAFTS,
        help=f"grafts timed one by one, separated by '|' (default {GRAFTS})",
    )
    ap.add_argument("--recompute", default="LT:q4:o,ffn", help="a graft also timed uncached")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args(argv)
    if min(args.prompts, args.new_tokens, args.threads or 1) < 1:
        ap.error("--prompts, --new-tokens and --threads must be at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    grafts = [g.strip() for g in args.grafts.split("|") if g.strip()]
    loaded = graft.load_model(args.model, device="cpu")
    base, tok = loaded.model.eval(), loaded.tokenizer
    donor = perturbed_copy(base, seed=1)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    room = getattr(base.config, "max_position_embeddings", 10**6) - args.new_tokens
    prompts = headline_prompts(tok, args.prompts, room)
    texts = [p.input_ids for p in prompts]
    fields = [p.spans for p in prompts]
    device = torch.device("cpu")

    def ours(spec: str, n: int, cache: bool = True):
        return graft.generate(
            base,
            {"sft": donor},
            tok,
            texts,
            spec,
            fields=fields,
            max_new_tokens=n,
            stop_at_eos=False,
            cache=cache,
            batch_size=len(texts),
        )

    _plain_generate(base, prompts, 2, pad_id)  # warm-up
    ours("LT:all:all", 2)
    got: dict[tuple[str, bool], list] = {}
    plain_ids: list[list[int]] = []
    t_plain = timed(
        lambda: plain_ids.extend(_plain_generate(base, prompts, args.new_tokens, pad_id)), device
    )
    lengths = sorted(len(t) for t in texts)
    print(
        f"{args.model}, {len(texts)} prompts of {lengths[0]}-{lengths[-1]} tokens, "
        f"{args.new_tokens} new tokens each, greedy, {torch.get_num_threads()} threads, one run:"
    )
    print(f"  {'plain model.generate (cache)':<47} {t_plain:7.2f} s")
    runs = [(g, True) for g in grafts] + ([(args.recompute, False)] if args.recompute else [])
    for spec, cache in runs:
        t = timed(
            lambda s=spec, c=cache: got.__setitem__((s, c), ours(s, args.new_tokens, c)), device
        )
        label = f"{spec}{'' if cache else ' (recompute)'}"
        print(f"  graft.generate {label:<32} {t:7.2f} s   ratio {t / t_plain:5.2f}")
    if ("none", True) in got:
        same = [g.new_ids[0] for g in got[("none", True)]] == plain_ids
        print(f"  'none' writes the plain model's tokens: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
