"""graft's public functions used by the benchmarks, imported in one place."""

from __future__ import annotations

from graft.core.arch import Architecture, architecture_of
from graft.core.engine import run_grafts
from graft.core.plan import GraftRow, default_pad_id
from graft.core.prefix import cache_argument
from graft.core.spec import GraftSpec, ResolvedGraft, parse_spec
from graft.core.tiny import perturbed_copy, tiny_pair

__all__ = [
    "Architecture",
    "GraftRow",
    "GraftSpec",
    "ResolvedGraft",
    "architecture_of",
    "cache_argument",
    "default_pad_id",
    "parse_spec",
    "perturbed_copy",
    "run_grafts",
    "tiny_pair",
]
