"""Large CPU results backed by transparent huge pages (graft.core.host_memory): advised only
where the kernel offers them and only over whole huge pages inside the tensor, never changing
a number."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import graft.core.host_memory as host_memory
from graft.core.engine import GraftRow, engine_path, run_grafts
from graft.core.host_memory import HUGE_PAGE_BYTES, MIN_ADVISED_BYTES, empty_huge
from graft.core.spec import parse_spec
from graft.core.tiny import tiny_pair

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def advised(monkeypatch):
    """The (start, length, advice) of every madvise call, the kernel said to offer THP."""
    calls = []

    def madvise(start, length, advice):
        calls.append((start, length, advice))
        return 0

    monkeypatch.setattr(host_memory, "_madvise", lambda: madvise)
    monkeypatch.setattr(host_memory, "_kernel_offers", lambda: True)
    monkeypatch.setattr(host_memory, "_failed", [])
    return calls


def test_a_large_tensor_is_advised_over_whole_huge_pages_inside_it(advised):
    tensor = empty_huge((64, 128_256), torch.float32)
    assert tensor.shape == (64, 128_256) and tensor.dtype == torch.float32
    [(start, length, advice)] = advised
    begin, end = tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * 4
    assert advice == 14  # MADV_HUGEPAGE
    assert start % HUGE_PAGE_BYTES == 0 and length % HUGE_PAGE_BYTES == 0
    assert begin <= start and start + length <= end
    assert start - begin < HUGE_PAGE_BYTES and end - (start + length) < HUGE_PAGE_BYTES


def test_a_small_tensor_is_left_alone(advised):
    empty_huge((MIN_ADVISED_BYTES // 4 - 1,), torch.float32)
    assert advised == []


def test_nothing_is_advised_where_the_kernel_offers_no_huge_pages(advised, monkeypatch):
    monkeypatch.setattr(host_memory, "_kernel_offers", lambda: False)
    empty_huge((64, 128_256), torch.float32)
    assert advised == [] and not host_memory.huge_pages_available()


def test_a_failed_madvise_turns_it_off_and_the_tensor_is_still_returned(monkeypatch):
    monkeypatch.setattr(host_memory, "_madvise", lambda: lambda *args: -1)
    monkeypatch.setattr(host_memory, "_kernel_offers", lambda: True)
    monkeypatch.setattr(host_memory, "_failed", [])
    assert host_memory.huge_pages_available()
    tensor = empty_huge((64, 128_256), torch.float32)
    assert tensor.numel() == 64 * 128_256
    assert not host_memory.huge_pages_available()


def _anon_huge_kib(address: int) -> int:
    """AnonHugePages (KiB) of the mapping of this process that holds ``address``."""
    in_range, total = False, 0
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if head:
            in_range = int(head[1], 16) <= address < int(head[2], 16)
        elif in_range and line.startswith("AnonHugePages:"):
            total += int(line.split()[1])
    return total


def test_on_this_machine_the_result_is_mapped_as_huge_pages_when_offered():
    """The real kernel, no mocks: where huge pages are offered, a 64 MiB result written once
    is (at least partly) backed by them; where not, graft says so."""
    if not host_memory.huge_pages_available():
        setting = Path("/sys/kernel/mm/transparent_hugepage/enabled")
        assert not setting.exists() or "[never]" in setting.read_text()
        return
    tensor = empty_huge((128, 128_256), torch.float32)
    tensor.fill_(1.0)
    # the advised range starts at the first huge-page boundary inside the tensor (its own
    # mapping once advised)
    assert _anon_huge_kib(tensor.data_ptr() + HUGE_PAGE_BYTES) >= HUGE_PAGE_BYTES // 1024


def test_grafted_logits_are_the_same_with_and_without_huge_pages(monkeypatch):
    base, donor = tiny_pair("llama", seed=0)
    ids = [1, 7, 9, 12, 5, 33]
    rows = [
        GraftRow(ids, {"FE": [1, 2]}, parse_spec(s)) for s in ("none", "LT:all:all", "FE:all:o")
    ]
    monkeypatch.setattr(host_memory, "MIN_ADVISED_BYTES", 0)  # advise even a tiny result
    with_huge = run_grafts(base, {"sft": donor}, rows, batch_size=2)
    monkeypatch.setattr(host_memory, "_failed", [True])
    without = run_grafts(base, {"sft": donor}, rows, batch_size=2)
    assert torch.equal(with_huge, without)


def test_a_run_records_whether_its_result_uses_huge_pages(monkeypatch):
    base, donor = tiny_pair("gpt2", seed=0)
    assert engine_path(base, {"sft": donor})["result_huge_pages"] is (
        host_memory.huge_pages_available()
    )
    monkeypatch.setattr(host_memory, "_failed", [True])
    assert engine_path(base, {"sft": donor})["result_huge_pages"] is False
    assert engine_path(base, remote=True)["result_huge_pages"] is False
