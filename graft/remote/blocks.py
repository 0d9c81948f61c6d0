"""Ship mode over the payload limit, exactly: a batch's forward pass split into layer blocks.

A ship-mode request carries the donor modules of every cell its batches graft. When one
batch needs more donor weights than a request may carry (``max_payload_mb``), the executor
cuts its forward pass between decoder layers into *blocks* and sends one request per block:

- a block's request carries only the donor modules grafted inside the block, plus the
  residual stream entering it ([rows, positions, d] per batch, the previous block's result);
- on the server the layers before the block are skipped (their output is that residual
  stream), the block's layers run with their patches, and the trace stops at the next
  block's first layer, returning the residual stream entering it;
- the first block starts from the token ids (embeddings included); the last one ends with
  the final norm and the head and returns what an unsplit request returns (logits, or
  per-row metrics).

Every layer runs once, on the inputs it gets in one pass, so the result is the unsplit
request's bit for bit (the residual stream travels exactly, in the server's dtype). The cost:
one request per block, the residual stream up and down once per block, and the embeddings
recomputed per block (a table lookup).

Stages, in forward order: ``-1`` the embeddings, ``0 .. n_layers - 1`` the decoder layers,
``n_layers`` the final norm and the head. Blocks are consecutive stages, filled greedily in
forward order up to the donor-weight budget of a request (the fewest requests). A single
module, or one layer's grafted modules, over that budget cannot be split: that is a one-line
:class:`~graft.errors.RemoteError` naming it and what to do instead.

:func:`run_block` runs inside the trace (on the server); like :mod:`graft.core.execution.trace` it
uses only torch and plain namespaces and travels by value.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from graft.core.execution.trace import graft_trace_body, last_logits, row_metrics
from graft.core.families.arch import Architecture
from graft.core.planning.plan import BatchPlan
from graft.errors import RemoteError
from graft.remote.payload import format_bytes

#: A donor module: (donor name, module path).
Key = tuple[str, str]
#: What a request carries besides donor weights, residual streams and masks, at most: the
#: trace's code (it travels by value) and envelope, measured at 40 KB uncompressed and 8 KB
#: with zstd.
TRACE_BYTES = 64 * 1024
#: Most of the request limit the residual streams of one split request may take: more
#: batches wait for the next split request.
RESIDUAL_SHARE = 0.25
_FIXES = (
    "use donor_mode='hosted' (a server holding the donor), load the donor in bfloat16, or "
    "raise max_payload_mb on a server that allows it"
)


@dataclass(frozen=True)
class Block:
    """Consecutive stages of the forward pass that one split request runs.

    Args:
        start: its first stage: -1 starts from the token ids; a layer index ``k`` means the
            request carries the residual stream entering layer ``k`` (``n_layers``: entering
            the final norm).
        stop: the stage after its last: ``n_layers + 1`` ends with the head (the request
            returns the run's logits or metrics); otherwise it returns the residual stream
            entering stage ``stop``.
        n_layers: the model's decoder layers.
        layers_path: module path of the model's decoder layers.
        keys: the donor modules its patches call.
        payload: bytes of those donor modules.
    """

    start: int
    stop: int
    n_layers: int
    layers_path: str
    keys: frozenset[Key]
    payload: int

    @property
    def last(self) -> bool:
        return self.stop > self.n_layers

    def label(self) -> str:
        """What it runs: ``embeddings and layers 0-2 of 48``, ``layers 3-6 of 48``, ``the
        head``..."""
        lo, hi = max(self.start, 0), min(self.stop - 1, self.n_layers - 1)
        parts = ["embeddings"] if self.start < 0 else []
        if lo <= hi:
            parts.append(f"layer {lo}" if lo == hi else f"layers {lo}-{hi}")
            parts[-1] += f" of {self.n_layers}"
        if self.last:
            parts.append("the head")
        return " and ".join(parts)


def stage_of(arch: Architecture, path: str) -> int:
    """The stage of the module at ``path`` (see the module docstring)."""
    prefix = arch.table.layers_path + "."
    if path.startswith(prefix):
        return int(path[len(prefix) :].split(".", 1)[0])
    if path in (arch.table.final_norm_path, arch.table.unembed_path):
        return arch.n_layers
    return -1


def keys_by_stage(arch: Architecture, plans: Iterable[BatchPlan]) -> dict[int, set[Key]]:
    """The donor modules the plans' patches call, by stage."""
    out: dict[int, set[Key]] = {}
    for plan in plans:
        for p in plan.patches:
            out.setdefault(stage_of(arch, p.path), set()).add((p.donor, p.path))
    return out


def residual_bytes(plan: BatchPlan, hidden: int, itemsize: int) -> int:
    """Bytes of a plan's residual stream: rows x positions x ``hidden`` values."""
    rows, positions = plan.input_ids.shape
    return int(rows * positions * hidden * itemsize)


def reserve_bytes(plans: Sequence[BatchPlan], hidden: int, itemsize: int) -> int:
    """What a split request of ``plans`` carries besides donor weights, at most: their
    residual streams, their masks (every patch's, an upper bound) and :data:`TRACE_BYTES`."""
    masks = sum(
        p.rows.numel() + sum(m.numel() for _, m in p.slices) for plan in plans for p in plan.patches
    )
    residual = sum(residual_bytes(plan, hidden, itemsize) for plan in plans)
    return residual + masks + TRACE_BYTES


def plan_blocks(
    arch: Architecture,
    stages: Mapping[int, set[Key]],
    size_of: Callable[[Iterable[Key]], int],
    budget: int,
    limit: int,
) -> list[Block]:
    """The fewest blocks, in forward order, each grafting at most ``budget`` bytes of donor
    modules (``size_of(keys)``: their bytes, shared tensors once).

    Raises:
        RemoteError: kind ``payload``: a single module, or one layer's grafted modules, over
            ``budget`` (``limit``: the request limit, named in the message).
    """
    for stage in sorted(stages):
        for key in sorted(stages[stage]):
            size = size_of([key])
            if size > budget:
                raise RemoteError(
                    f"donor {key[0]!r} module {key[1]} alone is {format_bytes(size)}, over the "
                    f"{format_bytes(budget)} of donor weights a request may carry (limit "
                    f"{format_bytes(limit)}, max_payload_mb): ship mode splits a request "
                    f"between layers, never inside a module; {_FIXES}",
                    kind="payload",
                )
    blocks: list[Block] = []
    start, current = -1, set[Key]()

    def close(stop: int) -> None:
        blocks.append(
            Block(
                start=start,
                stop=stop,
                n_layers=arch.n_layers,
                layers_path=arch.table.layers_path,
                keys=frozenset(current),
                payload=size_of(current) if current else 0,
            )
        )

    for stage in range(-1, arch.n_layers + 1):
        keys = stages.get(stage, set())
        if keys and size_of(current | keys) > budget:
            size = size_of(keys)
            if size > budget:
                where = "the head" if stage == arch.n_layers else f"layer {stage}"
                raise RemoteError(
                    f"the donor modules grafted in {where} take {format_bytes(size)} together, "
                    f"over the {format_bytes(budget)} of donor weights a request may carry "
                    f"(limit {format_bytes(limit)}, max_payload_mb): ship mode splits a request "
                    f"between layers, never inside one; graft fewer components there, or "
                    f"{_FIXES}",
                    kind="payload",
                )
            close(stage)
            start, current = stage, set()
        current |= keys
    close(arch.n_layers + 1)
    return blocks


def trace_block(block: Block, residual: torch.Tensor | None) -> types.SimpleNamespace:
    """What :func:`run_block` needs of ``block`` (a namespace: no graft class on the server)."""
    return types.SimpleNamespace(
        layers_path=block.layers_path,
        start=block.start,
        stop=block.stop,
        n_layers=block.n_layers,
        residual=residual,
    )


def run_block(model: Any, batch: types.SimpleNamespace, donor_modules: Any) -> torch.Tensor:
    """Inside an open trace of ``model`` on ``batch.inputs``: run the block ``batch.block``
    with the batch's patches (those of the block only) and return the residual stream
    entering the next block, or, for the last block, what
    :func:`graft.core.execution.trace.graft_batch` returns. The caller stops the trace after a block
    that is not the last."""
    block = batch.block

    def layer(j: int) -> Any:
        return model.get(block.layers_path + "." + str(j))

    if block.residual is not None:
        first = layer(0)
        x = first.input  # the embeddings: where, and in which dtype, the server computes
        h = block.residual.to(device=x.device, dtype=x.dtype)
        if block.start == 0:
            first.input = h
        for j in range(block.start):  # skipped: each passes the residual stream on
            layer(j).skip(h)
    graft_trace_body(model, batch.patches, donor_modules)
    if block.stop < block.n_layers:
        return layer(block.stop).input
    if block.stop == block.n_layers:
        return layer(block.n_layers - 1).output
    picked = last_logits(model.output.logits, batch)
    if batch.targets is None:
        return picked
    return row_metrics(picked, batch.targets, batch.top_k)
