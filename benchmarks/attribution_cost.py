"""The cost of graft attribution against real grafting, every cell of the embedded model.

For ``--prompts`` headline prompts (the first actor as FE, the target " the": the cost does
not depend on it), every cell (layer x unit FE, LT x the default kinds ``q k v qkv o attn
mlp``) is

- attributed: ``graft.attribute``, one forward and one backward of the base per batch, timed
  whole, with the default estimator (``local``) and with ``linear``;
- grafted for real as ``graft-exp attribution --verify all`` grafts them: every cell, one
  ``graft.graft_texts`` call per prompt (with the ungrafted row), each cell's row run from
  its layer on (``LocalExecutor(resume_layers=True)``, the patching sweep's layer reuse),
  timed whole: the real sweep;
- grafted for real one forward per cell (the engine's default executor, no layer reuse):
  ``--sample`` cells per prompt, spread evenly over the cell list, in one call per prompt,
  the time per cell scaled to every cell (printed as that estimate).

It prints all three, the ratio of each real path to attribution, and a forward of the prompts grafting nothing as the unit
(attribution in forwards); each is called once untimed first. On a shared machine the
seconds grow with the load (recorded: the 1-minute load average after the timings); the
ratio is the number to read. The donor is a perturbed copy of the base by default (the cost does not depend on
its weights) or ``--donor FOLDER``. Run from the repository root::

    python -m benchmarks.attribution_cost [--prompts 3] [--sample 40] [--donor FOLDER]
        [--out results/NAME]
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import torch

from benchmarks.cli import benchmark_parser
from benchmarks.measure import median_seconds, settings_of, write_table
from benchmarks.workload import headline_prompts

TARGET = " the"
UNITS = ("FE", "LT")


def measure(
    model: str, donor: str | None, prompts: int, sample: int, repeats: int
) -> dict[str, float | int | str]:
    """Time attribution of every cell and real grafts of a sample, on ``model``; one row."""
    import graft
    from graft.core import DEFAULT_KINDS, LocalExecutor, architecture_of
    from graft.models import perturbed_copy

    loaded = graft.load_model(model)
    base, tok = loaded.model, loaded.tokenizer
    donor_model = graft.load_model(donor).model if donor else perturbed_copy(base, seed=1)
    chosen = headline_prompts(tok, prompts, max_tokens=32)
    texts = [p.text for p in chosen]
    fields = [{"FE": p.text.split(" starred", 1)[0]} for p in chosen]
    n_layers = architecture_of(base).n_layers
    cells = [
        f"{unit}:{layer}:{kind}"
        for layer in range(n_layers)
        for unit in UNITS
        for kind in DEFAULT_KINDS
    ]
    step = max(1, len(cells) // sample)
    picked = cells[::step][:sample]
    # warm up: the first call of each pays for imports and one-off setup
    with torch.no_grad():
        graft.graft_texts(base, donor_model, tok, texts[0], "none", fields=fields[0])
    graft.attribute(base, donor_model, tok, texts[0], TARGET, fields=fields[0], kinds=["o"])
    with torch.no_grad():
        forward = median_seconds(
            lambda: graft.graft_texts(base, donor_model, tok, texts, "none", fields=fields), repeats
        )
    attribution = median_seconds(
        lambda: graft.attribute(base, donor_model, tok, texts, TARGET, fields=fields), repeats
    )
    linear = median_seconds(
        lambda: graft.attribute(
            base, donor_model, tok, texts, TARGET, fields=fields, estimator="linear"
        ),
        repeats,
    )

    def real_sample() -> None:
        for text, named in zip(texts, fields, strict=True):
            graft.graft_texts(base, donor_model, tok, text, ["none", *picked], fields=named)

    def real_sweep() -> None:
        for text, named in zip(texts, fields, strict=True):
            graft.graft_texts(
                base,
                donor_model,
                tok,
                text,
                ["none", *cells],
                fields=named,
                executor=LocalExecutor(resume_layers=True),
            )

    with torch.no_grad():
        sweep = median_seconds(real_sweep, repeats)
        real = median_seconds(real_sample, repeats)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    per_cell = real / (len(picked) * len(texts))
    real_all = per_cell * len(cells) * len(texts)
    return {
        "model": model,
        "prompts": len(texts),
        "cells_per_prompt": len(cells),
        "attribution_s": round(attribution, 3),
        "forward_s": round(forward, 3),
        "attribution_forwards": round(attribution / forward, 2),
        "linear_s": round(linear, 3),
        "linear_forwards": round(linear / forward, 2),
        "real_sample_cells": len(picked) * len(texts),
        "real_sample_s": round(real, 3),
        "real_per_cell_s": round(per_cell, 4),
        "real_all_cells_s_scaled": round(real_all, 1),
        "ratio": round(real_all / attribution, 1),
        "real_sweep_s": round(sweep, 3),
        "sweep_ratio": round(sweep / attribution, 1),
        "load_average": None if load is None else round(load, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = benchmark_parser("benchmarks.attribution_cost", __doc__ or "")
    ap.add_argument("--model", default="smollm2-135m", help="the base (default: the embedded one)")
    ap.add_argument("--donor", default=None, help="a donor folder (default: a perturbed copy)")
    ap.add_argument("--prompts", type=int, default=3, help="headline prompts")
    ap.add_argument("--sample", type=int, default=40, help="cells grafted for real, per prompt")
    ap.add_argument("--repeats", type=int, default=1, help="timed repeats (median reported)")
    ap.add_argument("--out", default=None, help="a results folder: write attribution_cost.csv")
    args = ap.parse_args(argv)
    for name in ("prompts", "sample", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1")
    row = measure(args.model, args.donor, args.prompts, args.sample, args.repeats)
    print(
        f"{row['model']}, {row['prompts']} prompts x {row['cells_per_prompt']} cells "
        f"(layer x FE, LT x q k v qkv o attn mlp), {torch.get_num_threads()} threads"
    )
    print(
        f"  attribution, every cell:  {row['attribution_s']:8.2f} s  "
        f"({row['attribution_forwards']} plain forwards of the prompts, {row['forward_s']} s each)"
    )
    print(
        f"  the same, estimator linear:  {row['linear_s']:8.2f} s  "
        f"({row['linear_forwards']} plain forwards)"
    )
    print(
        f"  real sweep, every cell, from each cell's layer on: {row['real_sweep_s']:8.1f} s  "
        f"({row['sweep_ratio']}x attribution)"
    )
    print(
        f"  real grafts, one forward a cell:  {row['real_all_cells_s_scaled']:8.1f} s  (scaled "
        f"from {row['real_sample_cells']} cells grafted in {row['real_sample_s']} s, "
        f"{row['real_per_cell_s']} s a cell; {row['ratio']}x attribution)"
    )
    print(f"  1-minute load average {row['load_average']}")
    if args.out:
        settings = settings_of(args, "model", "donor", "prompts", "sample", "repeats")
        path = write_table(args.out, "attribution_cost", [row], argv, "cpu", settings)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
