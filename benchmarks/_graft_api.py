"""graft's public functions used by the benchmarks, from wherever the package keeps them.

The engine, spec and architecture modules are moving into subpackages (``graft.core.*``);
importing them here, newest location first, keeps every benchmark runnable on both layouts.
"""

from __future__ import annotations

try:  # the subpackage layout
    from graft.core.arch import Architecture, architecture_of
    from graft.core.engine import GraftRow, default_pad_id, run_grafts
    from graft.core.spec import GraftSpec, ResolvedGraft, parse_spec
    from graft.core.tiny import perturbed_copy, tiny_pair
except ImportError:  # the flat layout
    from graft.arch import Architecture, architecture_of
    from graft.engine import GraftRow, default_pad_id, run_grafts
    from graft.spec import GraftSpec, ResolvedGraft, parse_spec
    from graft.tiny import perturbed_copy, tiny_pair

__all__ = [
    "Architecture",
    "GraftRow",
    "GraftSpec",
    "ResolvedGraft",
    "architecture_of",
    "default_pad_id",
    "parse_spec",
    "perturbed_copy",
    "run_grafts",
    "tiny_pair",
]
