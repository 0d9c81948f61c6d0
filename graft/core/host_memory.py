"""Large CPU tensors the engine writes once, backed by transparent huge pages where the
kernel offers them.

A fresh CPU tensor of ``rows x vocabulary`` floats (131 MB for 256 rows of Llama-3.2's
128,256 tokens) is mapped page by page as it is first written: 32,000 faults of 4 KiB,
which on this project's CPUs cost about as much as computing the head's product
(55 ms against 19 ms with 2 MiB pages, measured on a 2-core AMD EPYC). The engine's
result and its head-product buffer (:mod:`graft.core.head`) are such tensors, so on Linux
they are advised as huge pages (``madvise(MADV_HUGEPAGE)``) before their first write,
as PyTorch does for every large CPU tensor when ``THP_MEM_ALLOC_ENABLE=1`` is set at
start-up. Only where the page size changes: the numbers are the same.

:func:`huge_pages_available` says whether it applies (a run's ``config.json`` records it as
``result_huge_pages``): Linux, transparent huge pages set to ``always`` or ``madvise`` in
``/sys/kernel/mm/transparent_hugepage/enabled``, and a C library that has ``madvise``.
Elsewhere the tensors are ordinary ones.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from functools import cache
from pathlib import Path

import torch

#: ``MADV_HUGEPAGE`` in Linux's ``<sys/mman.h>``
_MADV_HUGEPAGE = 14
#: the size of a transparent huge page on x86-64 and arm64 Linux (4 KiB base pages)
HUGE_PAGE_BYTES = 2 << 20
#: tensors smaller than this stay ordinary (a few huge pages would save little)
MIN_ADVISED_BYTES = 8 << 20
_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
_failed: list[bool] = []


@cache
def _madvise():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


@cache
def _kernel_offers() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        setting = _SETTING.read_text()
    except OSError:
        return False
    return "[always]" in setting or "[madvise]" in setting


def huge_pages_available() -> bool:
    """Whether :func:`empty_huge` backs large tensors with transparent huge pages here."""
    return not _failed and _kernel_offers() and _madvise() is not None


def _advise(tensor: torch.Tensor) -> None:
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    # only whole huge pages inside the tensor: madvise needs an aligned start, and a huge
    # page reaching past the tensor would map memory the allocator may hand out elsewhere
    first = -(-start // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    last = end // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
    if last <= first:
        return
    if _madvise()(first, last - first, _MADV_HUGEPAGE) != 0:
        _failed.append(True)  # e.g. a kernel built without THP: ordinary pages from now on


def empty_huge(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype)`` on the CPU, advised as transparent huge pages before
    its first write when it is at least :data:`MIN_ADVISED_BYTES` and
    :func:`huge_pages_available`."""
    tensor = torch.empty(shape, dtype=dtype)
    if tensor.numel() * tensor.element_size() >= MIN_ADVISED_BYTES and huge_pages_available():
        _advise(tensor)
    return tensor
