"""graft's public functions used by the benchmarks, imported in one place."""

from __future__ import annotations

from graft.core.arch import Architecture, architecture_of
from graft.core.engine import run_grafts
from graft.core.plan import GraftRow, default_pad_id
from graft.core.prefix import cache_argument
from graft.core.spec import GraftSpec, ResolvedGraft, parse_spec
from graft.core.tiny import perturbed_copy, tiny_pair
from graft.errors import GraftError
from graft.results.paper.agreement import read_csv_table
from graft.results.provenance import machine_info
from graft.results.publish import (
    PROVENANCE_FILE,
    machine_label,
    provenance_entries,
    write_benchmark_table,
)

__all__ = [
    "PROVENANCE_FILE",
    "Architecture",
    "GraftError",
    "GraftRow",
    "GraftSpec",
    "ResolvedGraft",
    "architecture_of",
    "cache_argument",
    "default_pad_id",
    "machine_info",
    "machine_label",
    "parse_spec",
    "perturbed_copy",
    "provenance_entries",
    "read_csv_table",
    "run_grafts",
    "tiny_pair",
    "write_benchmark_table",
]
