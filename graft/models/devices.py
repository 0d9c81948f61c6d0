"""Device names as the user writes them, checked without torch (the command line parses
``--device`` before anything heavy loads; :func:`graft.models.loading.resolve_device` then
asks torch whether this machine has the device)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from graft.errors import DeviceError

_FORM = re.compile(r"(?P<type>[a-z]+)(?::(?P<index>\d+))?")
#: Device types graft runs on.
SUPPORTED = ("cpu", "cuda", "mps")
#: Other device types torch knows: named as unsupported rather than unknown.
OTHER_TORCH_TYPES = ("meta", "xpu", "hip", "xla", "hpu", "mtia", "ipu", "lazy", "vulkan")


@dataclass(frozen=True)
class DeviceName:
    """A device as written; ``str()`` writes it as torch does.

    Args:
        type: ``cpu``, ``cuda`` or ``mps``.
        index: the device's number (None: the type's default).
    """

    type: str
    index: int | None

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"


def parse_device(device: Any) -> DeviceName:
    """``device`` (a string or a torch device) checked for its form, whether or not this
    machine has it (a plan for a GPU job is made on a machine without one).

    Raises:
        DeviceError: an unknown device string (``"banana"``), a CPU index other than 0
            (``cpu:1``), or a device type graft does not run on.
    """
    text = str(device)
    match = _FORM.fullmatch(text)
    if match is None or match["type"] not in (*SUPPORTED, *OTHER_TORCH_TYPES):
        raise DeviceError(
            f"unknown device {text!r}; use cpu, cuda or cuda:<index> (or leave it unset "
            "for cuda when available, else cpu)",
            param="device",
        )
    name = DeviceName(match["type"], None if match["index"] is None else int(match["index"]))
    if name.type == "cpu" and name.index not in (None, 0):
        raise DeviceError(
            f"device {text!r}: torch runs on one CPU device (its cores share the work); use cpu",
            param="device",
        )
    if name.type not in SUPPORTED:
        raise DeviceError(f"device {text!r} is not supported; use cpu or cuda", param="device")
    return name
