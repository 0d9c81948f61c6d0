"""The exactness bound of a model as measured: graft against the token-by-token reference,
and each token-by-token routine without a graft against a plain forward.

Run from the repository root::

    python -m benchmarks.real_model_bound --model smollm2-135m [--donor FOLDER]
        [--prompts 3] [--dtype float32] [--device cpu] [--seed 1] [--json out.json]
        [--out results/FOLDER]
    python -m benchmarks.real_model_bound --model tiny          # every tiny family
    python -m benchmarks.real_model_bound --model gemma3-270m --dtype float64 [--norms-in-dtype]

Workload: the first ``--prompts`` headline prompts ("<actor> starred in a movie with",
real actor names, the first actor as FE), each under the E1 position grafts (PRE, SFT, FE,
LT, FE+LT, (FE+LT)^C, FE^C, LT^C) and the paper's eight component sets at LT in the last
quarter of layers (E3); the donor is ``--donor`` or the base plus seeded noise on every
parameter (``perturbed_copy``). The engine runs every row in one left-padded batch. Printed,
per model, in the model's dtype (logits as float32, float64 for a float64 model):

- ``graft - ref``: max |graft - token-by-token reference| over every row
  (``tests/reference.py``, the tests' independent weight-swap routine), also split into
  the E1 rows and the component rows;
- ``ref(none) - plain``: max |reference with no graft - a plain full-sequence forward of
  the prompt alone|: what token-by-token decoding with a KV cache alone moves the logits by;
- ``paper(none) - plain``: the same for the authors' routine (``benchmarks.paper_routine``,
  a deep copy of the model per token);
- ``graft(none) - plain``: the engine with no graft, in its padded batch, against the
  plain forward;
- ``max |logit|``: the largest plain-forward logit (the scale); ``rel.``: ``graft - ref``
  over it.

``--dtype float64`` casts the float32 model up, where rounding shrinks with the precision
(float64's epsilon is 5e8 times smaller than float32's) and a wrong graft would not;
``--norms-in-dtype`` also makes the RMSNorms compute in float64 (transformers' compute in
float32 whatever the dtype, so float64 alone still rounds to float32 at every norm).

graft is one full-sequence pass: where the two token-by-token routines differ from a plain
forward by more than ``graft - ref``, the bound is the reference's own rounding, not
graft's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import nn

from benchmarks._graft_api import (
    Architecture,
    GraftRow,
    ResolvedGraft,
    perturbed_copy,
    run_grafts,
)
from benchmarks.md_table import md_table
from benchmarks.measure import settings_of, write_table
from benchmarks.paper_routine import paper_rows, stacked_rows
from benchmarks.workload import E1_GRAFTS, E3_GRAFTS, Prompt, graft_rows, headline_prompts
from graft.errors import GraftError
from graft.models import TINY_FAMILIES
from tests.reference import reference_last_logits

#: The columns of the printed table, in order: result key -> header.
COLUMNS = {
    "graft_vs_ref": "graft - ref",
    "graft_vs_ref_e1": "E1 rows",
    "graft_vs_ref_components": "component rows",
    "ref_none_vs_plain": "ref(none) - plain",
    "paper_none_vs_plain": "paper(none) - plain",
    "graft_none_vs_plain": "graft(none) - plain",
    "max_abs_logit": "max abs logit",
    "relative": "rel. (graft - ref) / max abs logit",
}


def _logits(out: torch.Tensor) -> torch.Tensor:
    return out if out.dtype == torch.float64 else out.float()


@torch.no_grad()
def plain_last_logits(model: nn.Module, prompt: Prompt) -> torch.Tensor:
    """The last-position logits of one unpadded full-sequence forward of ``prompt``."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt.input_ids], dtype=torch.long, device=device)
    return _logits(model(input_ids=ids).logits[0, -1]).cpu()


def reference_rows(
    base: nn.Module, donors: Mapping[str, nn.Module], rows: Sequence[GraftRow]
) -> torch.Tensor:
    """The reference's last-position logits of every row, stacked: [rows, vocab]."""

    def last_logits(row: GraftRow, res: ResolvedGraft, arch: Architecture) -> torch.Tensor:
        del arch  # the reference finds its modules by itself
        ids = list(row.input_ids)
        return reference_last_logits(
            base, dict(donors), ids, res.cells, res.final_norm_donor, res.unembed_donor
        )

    return stacked_rows(base, rows, last_logits)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def measure(base: nn.Module, donor: nn.Module, tokenizer, n_prompts: int) -> dict:
    """Every number of the table for one (base, donor) pair on ``n_prompts`` prompts."""
    max_tokens = getattr(base.config, "max_position_embeddings", 10**9)
    prompts = headline_prompts(tokenizer, n_prompts, max_tokens)
    donors = {"sft": donor}
    e1 = graft_rows(prompts, E1_GRAFTS)
    components = graft_rows(prompts, E3_GRAFTS)
    rows = e1 + components
    grafted = run_grafts(base, donors, rows, batch_size=len(rows), padding_side="left")
    ref = reference_rows(base, donors, rows)
    diff = (grafted - ref).abs().amax(-1)
    nothing = graft_rows(prompts, {"PRE": E1_GRAFTS["PRE"]})
    plain = torch.stack([plain_last_logits(base, p) for p in prompts])
    none_rows = [i for i, row in enumerate(rows) if str(row.spec) == "none"]
    scale = float(plain.abs().max())
    result = {
        "prompts": len(prompts),
        "rows": len(rows),
        "graft_vs_ref": float(diff.max()),
        "graft_vs_ref_e1": float(diff[: len(e1)].max()),
        "graft_vs_ref_components": float(diff[len(e1) :].max()),
        "ref_none_vs_plain": _max_diff(reference_rows(base, donors, nothing), plain),
        "paper_none_vs_plain": _max_diff(paper_rows(base, donors, nothing), plain),
        "graft_none_vs_plain": _max_diff(grafted[none_rows], plain),
        "max_abs_logit": scale,
    }
    result["relative"] = result["graft_vs_ref"] / scale
    return result


def model_names(given: Sequence[str]) -> list[str]:
    """``--model`` values with ``tiny`` expanded to every tiny family."""
    names: list[str] = []
    for name in given:
        names += [f"tiny-{f}" for f in TINY_FAMILIES] if name == "tiny" else [name]
    return names


def load(name: str, dtype: str, device: str):
    """``graft.models.load_model``, and for ``float64`` the float32 model cast up: graft
    loads no model in float64, but the same computation in float64 tells rounding (which
    shrinks with the precision) from a wrong graft (which does not)."""
    from graft.models import load_model

    if dtype != "float64":
        return load_model(name, dtype=dtype, device=device)
    loaded = load_model(name, dtype="float32", device=device)
    return dataclasses.replace(loaded, model=loaded.model.to(torch.float64), dtype=torch.float64)


def _llama_form(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def _gemma_form(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return self._norm(x) * (1.0 + self.weight)


def keep_norms_in_dtype(model: nn.Module) -> int:
    """Make every RMSNorm of ``model`` compute in the model's dtype; return how many.

    transformers' RMSNorms compute in float32 whatever the model's dtype (Llama, Qwen:
    ``x.to(float32)``; Gemma: ``x.float()``), so a float64 model still rounds to float32
    at every norm. Two forms are known: ``weight * normed`` (a ``variance_epsilon``) and
    Gemma's ``normed * (1 + weight)``; another RMSNorm is refused rather than guessed.
    """
    count = 0
    for module in model.modules():
        name = type(module).__name__
        if not name.endswith("RMSNorm"):
            continue
        if hasattr(module, "variance_epsilon"):
            module.forward = types.MethodType(_llama_form, module)
        elif name.startswith("Gemma") and hasattr(module, "_norm"):
            module.forward = types.MethodType(_gemma_form, module)
        else:
            raise GraftError(
                f"--norms-in-dtype knows the Llama and Gemma RMSNorms, not {name}; drop it"
            )
        count += 1
    return count


def run(args: argparse.Namespace) -> list[dict]:
    """Load each model (and its donor), measure, and return one result per model."""
    results = []
    for name in model_names(args.model):
        loaded = load(name, args.dtype, args.device)
        if args.donor:
            donor = load(args.donor, args.dtype, args.device).model
        else:
            donor = perturbed_copy(loaded.model, seed=args.seed)
        if args.norms_in_dtype:
            keep_norms_in_dtype(loaded.model)
            keep_norms_in_dtype(donor)
        numbers = measure(loaded.model, donor, loaded.tokenizer, args.prompts)
        results.append(
            {
                "model": name,
                "dtype": str(loaded.dtype).removeprefix("torch."),
                "device": str(loaded.device),
                "donor": args.donor or f"perturbed_copy(seed={args.seed})",
                "norms": "in dtype" if args.norms_in_dtype else "transformers'",
                **numbers,
            }
        )
        del loaded, donor
    return results


def table(results: Sequence[dict]) -> str:
    """The results as a markdown table, one row per model."""
    head = ["model", "dtype", "rows", *COLUMNS.values()]
    body = []
    for r in results:
        cells = [r["model"], r["dtype"], str(r["rows"]), *(f"{r[k]:.1e}" for k in COLUMNS)]
        cells[len(head) - 2] = f"{r['max_abs_logit']:.1f}"  # the scale: not a difference
        body.append(cells)
    return md_table(head, body, right=len(head) - 2)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        action="append",
        required=True,
        help="registry name, hub id or folder (repeatable); 'tiny' = every tiny family",
    )
    parser.add_argument("--donor", help="donor model folder [default: a perturbed copy]")
    parser.add_argument("--prompts", type=int, default=3, help="headline prompts [3]")
    parser.add_argument(
        "--dtype",
        default="float32",
        help="model dtype; float64 casts the float32 model up [float32]",
    )
    parser.add_argument("--device", default="cpu", help="device [cpu]")
    parser.add_argument(
        "--norms-in-dtype",
        action="store_true",
        help="with --dtype float64: RMSNorms compute in float64 too (transformers' compute in "
        "float32 whatever the dtype)",
    )
    parser.add_argument("--seed", type=int, default=1, help="perturbed_copy seed [1]")
    parser.add_argument("--json", type=Path, help="also write every number here")
    parser.add_argument(
        "--out",
        type=Path,
        help="also write the table into this results folder (real_model_bound.csv) with its "
        "provenance (command, commit, versions, machine)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.norms_in_dtype and args.dtype != "float64":
        print(
            "--norms-in-dtype goes with --dtype float64 (other dtypes' norms already compute in float32 or wider)",
            file=sys.stderr,
        )
        return 2
    if args.donor and len(model_names(args.model)) > 1:
        print("--donor goes with one --model", file=sys.stderr)
        return 2
    try:
        with torch.no_grad():
            results = run(args)
    except GraftError as err:
        print(err, file=sys.stderr)
        return 2
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    if args.out:
        settings = settings_of(args, "prompts", "dtype", "seed", "norms_in_dtype")
        path = write_table(args.out, "real_model_bound", results, argv, args.device, settings)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
