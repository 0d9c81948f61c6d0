"""A benchmark's command line: its parser, and the options the timed benchmarks share with
their checks."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


def benchmark_parser(module: str, doc: str) -> argparse.ArgumentParser:
    """The parser of ``python -m module``, described by the first line of ``doc``."""
    return argparse.ArgumentParser(prog=f"python -m {module}", description=doc.splitlines()[0])


def add_common_options(
    ap: argparse.ArgumentParser, name: str, *, prompts: int, batch_size: int, paper_examples: int
) -> None:
    """The options of a benchmark ``name`` timed on headline prompts: ``--prompts``,
    ``--batch-size``, ``--repeats`` and ``--paper-examples`` with these defaults, ``--device``
    (where it runs), ``--json`` and ``--out`` (what it writes); :func:`check_common_options`
    checks them."""
    ap.add_argument(
        "--prompts", type=int, default=prompts, help="headline prompts (rows = 8 x this)"
    )
    ap.add_argument("--batch-size", type=int, default=batch_size)
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats (median reported)")
    ap.add_argument(
        "--paper-examples",
        type=int,
        default=paper_examples,
        help="FE+LT examples for the paper's routine",
    )
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--json", type=Path, default=None, help="write every result here")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"a results folder: write {name}.csv there with its provenance",
    )


def check_common_options(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse (``ap.error``) what :func:`add_common_options` read wrong: a count below 1,
    more paper examples than prompts, CUDA on a machine without it, a folder as ``--json``
    and a file as ``--out``."""
    for name in ("prompts", "batch_size", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 <= args.paper_examples <= args.prompts:
        ap.error("--paper-examples must be between 0 and --prompts")
    cuda = args.device is not None and torch.device(args.device).type == "cuda"
    if cuda and not torch.cuda.is_available():
        ap.error("--device cuda: this machine has no CUDA device; use --device cpu")
    if args.json is not None and args.json.is_dir():
        ap.error(f"--json {args.json} is a folder; give a file name such as out.json")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        ap.error(f"--out {args.out} is a file; give a results folder such as results/NAME")
