"""How much memory a device has free, and whether a planned peak fits in it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from graft.errors import DeviceError
from graft.models import parse_device, resolve_device
from graft.study.planning.memory import MemoryPlan, gib

#: The name of a device this machine does not have (its memory unknown).
ABSENT = "not on this machine"
#: A plan fits when its peak is at most this share of the free memory (the rest: allocator
#: rounding and fragmentation, the CUDA context's later growth, the plan's own error, which
#: was within 10% of measured peaks); between it and the whole free memory it is "tight".
FIT_SHARE = 0.9
#: On the CPU, glibc keeps much of what a finetune's activations freed instead of handing it
#: back, so the resident set grows past the tensors' peak by about this share of the
#: activations (SmolLM2-135M, docs/how-to/gpu.md#planning-memory-and-time) ...
CPU_HEAP_SHARE = 0.5
#: ... and a grafting run's by about this share of its weights (the engine's transient
#: tensors, the tokenizer, the results; the project's own grafting goal allows 0.25).
CPU_GRAFTING_SHARE = 0.2


@dataclass(frozen=True)
class DeviceMemory:
    """A device's memory as the plan sees it.

    Args:
        device: the device, e.g. ``cuda:0`` or ``cpu``.
        name: what it is, e.g. ``NVIDIA H100 80GB HBM3`` or ``CPU``.
        free_bytes: free now (CUDA: ``torch.cuda.mem_get_info``; CPU: ``MemAvailable`` of
            ``/proc/meminfo``); None where it cannot be read.
        total_bytes: the device's whole memory; None where it cannot be read.
    """

    device: str
    name: str
    free_bytes: int | None
    total_bytes: int | None

    def describe(self) -> str:
        if self.free_bytes is None:
            return f"{self.device} ({self.name}): free memory unknown"
        total = f" of {gib(self.total_bytes)}" if self.total_bytes else ""
        return f"{self.device} ({self.name}): {gib(self.free_bytes)} free{total}"


def device_memory(device: str | torch.device | None) -> DeviceMemory:
    """The free and total memory of ``device`` (default: CUDA if available, else CPU); a GPU
    this machine does not have: its memory unknown (a plan made for a GPU job elsewhere).

    Raises:
        DeviceError: an unknown device.
    """
    try:
        dev = resolve_device(device)
    except DeviceError:  # an unknown device raises again here; a missing GPU or MPS does not
        return DeviceMemory(str(parse_device(device)), ABSENT, None, None)
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        free, total = torch.cuda.mem_get_info(index)
        return DeviceMemory(f"cuda:{index}", torch.cuda.get_device_name(index), free, total)
    if dev.type == "cpu":
        info = _meminfo()
        return DeviceMemory("cpu", "CPU", info.get("MemAvailable"), info.get("MemTotal"))
    return DeviceMemory(str(dev), dev.type, None, None)


def _meminfo() -> dict[str, int]:
    """``/proc/meminfo`` in bytes (empty where there is none)."""
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        key, _, value = line.partition(":")
        words = value.split()
        if words and words[0].isdigit():
            out[key] = int(words[0]) * (1024 if words[1:] == ["kB"] else 1)
    return out


def needed_bytes(plan: MemoryPlan, device_type: str) -> int:
    """What ``plan`` needs of a device of ``device_type``: its peak, plus on the CPU what
    the heap keeps besides (:data:`CPU_HEAP_SHARE`, :data:`CPU_GRAFTING_SHARE`) and the
    host memory the plan names (tokenizers)."""
    if device_type != "cpu":
        return plan.peak_bytes
    if plan.kind == "finetune":
        return plan.peak_bytes + round(CPU_HEAP_SHARE * plan.activations_bytes)
    heap = round(CPU_GRAFTING_SHARE * plan.weights_bytes)
    return plan.peak_bytes + heap + plan.host_bytes


def verdict(needed: int, memory: DeviceMemory) -> str:
    """``"fits"``, ``"tight"`` (above :data:`FIT_SHARE` of the free memory),
    ``"does not fit"`` or ``"unknown"`` (free memory unreadable)."""
    if memory.free_bytes is None:
        return "unknown"
    if needed <= FIT_SHARE * memory.free_bytes:
        return "fits"
    return "tight" if needed <= memory.free_bytes else "does not fit"
