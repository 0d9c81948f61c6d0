"""Side-by-side timings of one-pass grafting vs the paper's token-by-token weight swap.

Run from the repository root: python -m benchmarks.speed [--family gpt2] [--layers 12] [--prompts 32]
Prints medians and ratios measured in this one run (machines here are shared and noisy).
"""

from __future__ import annotations

import argparse

import torch
import transformers

from benchmarks.measure import median_seconds
from graft.core import GraftRow, architecture_of, parse_spec, run_grafts
from graft.models import perturbed_copy
from tests.reference import reference_last_logits


def build(family: str, layers: int, d: int):
    if family == "gpt2":
        cfg = transformers.GPT2Config(
            n_embd=d, n_layer=layers, n_head=8, vocab_size=1024, bos_token_id=1, eos_token_id=2
        )
    else:
        cfg = transformers.LlamaConfig(
            hidden_size=d,
            num_hidden_layers=layers,
            num_attention_heads=8,
            intermediate_size=4 * d,
            vocab_size=1024,
            bos_token_id=1,
            eos_token_id=2,
        )
    torch.manual_seed(0)
    base = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    return base, perturbed_copy(base, seed=1)


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="gpt2", choices=["gpt2", "llama"])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--length", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    base, donor = build(args.family, args.layers, args.d)
    arch = architecture_of(base)
    g = torch.Generator().manual_seed(0)
    spec = parse_spec("FE+LT:all:all")
    rows = [
        GraftRow(torch.randint(0, 1024, (args.length,), generator=g).tolist(), {"FE": [2, 3]}, spec)
        for _ in range(args.prompts)
    ]
    resolved = [r.spec.resolve(arch, len(r.input_ids), r.spans) for r in rows]

    def one_pass():
        return run_grafts(base, {"sft": donor}, rows, batch_size=args.prompts)

    def reference():
        return [
            reference_last_logits(base, {"sft": donor}, list(r.input_ids), res.cells)
            for r, res in zip(rows, resolved, strict=True)
        ]

    def hooks():  # plain forward hooks: the lower bound for any one-pass implementation
        handles = []
        mask = torch.zeros(args.prompts, args.length, dtype=torch.bool)
        mask[:, [2, 3, args.length - 1]] = True
        for (layer, comp), _cell in resolved[0].cells.items():
            path, _ = arch.site_for(layer, comp)
            dmod = donor.get_submodule(path)

            def hook(mod, inp, out, dmod=dmod):
                new = out.clone()
                new[mask] = dmod(inp[0][mask])
                return new

            handles.append(base.get_submodule(path).register_forward_hook(hook))
        ids = torch.tensor([r.input_ids for r in rows])
        pos = torch.arange(args.length).expand(args.prompts, -1)
        base(input_ids=ids, position_ids=pos, logits_to_keep=1)
        for h in handles:
            h.remove()

    one_pass()  # warm up (nnsight wrapping, allocator)
    t_one = median_seconds(one_pass, args.repeats)
    t_hooks = median_seconds(hooks, args.repeats)
    t_ref = median_seconds(reference, 1)
    err = max(float((a - b).abs().max()) for a, b in zip(one_pass(), reference(), strict=True))
    print(
        f"model: {args.family} {args.layers} layers d={args.d}; {args.prompts} prompts x {args.length} tokens; graft FE+LT:all:all"
    )
    print(f"one-pass (nnsight, batched)   {t_one * 1e3:9.1f} ms")
    print(
        f"plain forward hooks           {t_hooks * 1e3:9.1f} ms   one-pass / hooks = {t_one / t_hooks:.2f}"
    )
    print(
        f"token-by-token weight swap    {t_ref * 1e3:9.1f} ms   reference / one-pass = {t_ref / t_one:.1f}x"
    )
    print(f"max |one-pass - reference| = {err:.2e}")


if __name__ == "__main__":
    main()
