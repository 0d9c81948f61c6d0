"""Measuring on this machine for the benchmarks: resident memory (now and peak), parameter
bytes, wall time of a call (synchronised on a GPU), the environment a result was measured in,
the JSON a benchmark writes and its table in a results folder."""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from torch import nn

MIB = 2**20


def current_rss() -> int:
    """Resident set size of this process in bytes (0 where /proc is missing)."""
    return _proc_status_bytes("VmRSS")


def peak_rss() -> int:
    """Peak RSS in bytes since the last ``reset_peak_rss`` (else since the process started)."""
    peak = _proc_status_bytes("VmHWM")
    if peak:
        return peak
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (Linux >= 4.0); False where that is not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _proc_status_bytes(key: str) -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def param_bytes(model: nn.Module) -> int:
    """Bytes of a model's distinct parameters (a tied tensor counted once)."""
    seen = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    return sum(seen.values())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Wall seconds of one call of ``fn`` (the device synchronised on both sides)."""
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """The median wall seconds of ``repeats`` calls of ``fn`` on the CPU."""
    return statistics.median(timed(fn, torch.device("cpu")) for _ in range(repeats))


def environment(
    device: torch.device,
    model_info: dict,
    argv: Sequence[str],
    module: str = "benchmarks.real_model",
) -> dict:
    """Versions, device and command (``python -m module argv``) of this run."""
    import nnsight
    import transformers

    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
    return {
        "command": " ".join(["python", "-m", module, *map(shlex.quote, argv)]),
        "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": f"{device.type}: {name}",
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "nnsight": nnsight.__version__,
        "transformers": transformers.__version__,
        "model": model_info,
    }


def release_free_heap() -> None:
    """Hand memory the allocator holds but no longer uses back to the system (glibc only)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` to ``path`` atomically (a temporary sibling renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def settings_of(args: argparse.Namespace, *names: str, **more: Any) -> dict[str, Any]:
    """The options ``names`` of ``args`` by name, then ``more``: the settings a benchmark's
    provenance records."""
    return {**{name: getattr(args, name) for name in names}, **more}


def write_table(
    out: str | os.PathLike[str],
    name: str,
    table: Sequence[Mapping[str, Any]],
    argv: Sequence[str] | None,
    device: Any,
    settings: Mapping[str, Any],
) -> Path:
    """Write the table of the benchmark ``benchmarks.<name>`` as ``out/<name>.csv`` with its
    provenance (:func:`write_benchmark_table`): the command that ran it with ``argv`` (None:
    this process's arguments), ``device`` and ``settings``. Return the CSV's path."""
    # graft is imported here, not with this module: plan_check measures memory with graft
    # imported only where it runs graft
    from benchmarks._graft_api import write_benchmark_table

    argv = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "-m", f"benchmarks.{name}", *argv])
    return write_benchmark_table(out, name, table, command, device, settings)
