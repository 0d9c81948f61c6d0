"""graft's public functions used by the benchmarks, imported in one place."""

from __future__ import annotations

from graft.core import (
    Architecture,
    GraftRow,
    GraftSpec,
    ResolvedGraft,
    architecture_of,
    cache_argument,
    default_pad_id,
    parse_spec,
    run_grafts,
)
from graft.errors import GraftError
from graft.models import perturbed_copy, tiny_pair
from graft.results import (
    PROVENANCE_FILE,
    machine_info,
    machine_label,
    provenance_entries,
    read_csv_table,
    reported_interval,
    write_benchmark_table,
)
from graft.study import GRAFT, protocol_of

__all__ = [
    "GRAFT",
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
    "protocol_of",
    "provenance_entries",
    "read_csv_table",
    "reported_interval",
    "run_grafts",
    "tiny_pair",
    "write_benchmark_table",
]
