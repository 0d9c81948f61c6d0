"""The server's part of a remote run's plan (``--remote --dry-run``), without contacting it.

A remote run (``RemoteConfig.mode == "remote"``) still finetunes its donors and loads its
models on this machine (:mod:`graft.study.planning.run_plan` plans that part); the server
runs every grafted forward pass. This module plans the server's part as
:class:`graft.remote.executor.RemoteExecutor` will send it: one request per stored batch (a
remote run hands the engine one stored batch at a time), a batch whose donor weights are
over ``max_payload_mb`` split between layers (:func:`graft.remote.blocks.plan_blocks`, the
executor's own rule), what each request carries (ship mode: the donor modules of the cells
its rows graft, sized on a weightless meta model at the run's dtype; hosted mode: names
only) and what comes back (a few numbers per row). The host and model key are the ones the
run would use, derived from the options alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from graft.errors import RemoteError
from graft.remote.config import RemoteConfig, hf_model_key
from graft.study.specs.grafts import NamedGraft

if TYPE_CHECKING:
    from graft.core.families.arch import Architecture
    from graft.remote.blocks import Block

#: A donor module: (donor name, module path).
Key = tuple[str, str]

#: Numbers a remote row returns: the target's log-probability and rank, and the top tokens'
#: ids and log-probabilities (``graft.study.running.batches.REMOTE_TOP_K`` of them).
RETURNED_TOP_K = 10
#: Bytes per token of a request's inputs: token ids, attention mask, position ids (int64).
_INPUT_BYTES = 3 * 8


@dataclass(frozen=True)
class BatchShape:
    """One stored batch, as far as the plan knows it.

    Args:
        rows: its (prompt, graft) rows.
        grafts: indices of the grafts its rows carry; None when the rows' order is not
            known here (no tokenizer): every graft is counted, an upper bound.
        tokens: its longest prompt in tokens, the length it is padded to (None: unknown,
            the run's longest counts).
    """

    rows: int
    grafts: frozenset[int] | None
    tokens: int | None = None


@dataclass
class RemotePlan:
    """What the server runs and what travels to it.

    Args:
        host: the server's URL (``host``, else env ``NDIF_HOST``, else nnsight's host).
        model_key: the key each request names the base by; None where the run cannot
            derive it (``key_problem`` says why and what to set).
        key_problem: why there is no model key, and the fix; None with one.
        donor_mode: ``ship`` or ``hosted``.
        rows: rows the server runs.
        batches: stored batches (one forward pass each, split or not).
        batch_size: rows per forward pass at most.
        tokens: the longest prompt in tokens (each batch is padded to its longest).
        requests: requests sent (a split batch: one per layer block).
        split: batches split between layers.
        payload_max: the most donor weights one request carries (0 in hosted mode).
        payload_total: donor weights over all requests.
        other_total: token ids, masks, residual streams of split batches and the trace's
            code over all requests, estimated from the longest prompt (an upper bound).
        exact: payloads counted per batch on the rows as the run orders them (else every
            batch is counted with every graft, an upper bound).
        refused: the one-line refusal the run would meet before sending (a module over
            the limit), else None.
        max_payload: the request limit in bytes.
        notes: what else the run sends that the plan does not count.
    """

    host: str
    model_key: str | None
    key_problem: str | None
    donor_mode: str
    rows: int
    batches: int
    batch_size: int
    tokens: int
    requests: int = 0
    split: int = 0
    payload_max: int = 0
    payload_total: int = 0
    other_total: int = 0
    exact: bool = True
    refused: str | None = None
    max_payload: int = 0
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        from graft.remote.payload import format_bytes

        bound = "" if self.exact else "at most "
        key = self.model_key if self.model_key else f"none: {self.key_problem}"
        split = (
            f" ({self.split} passes split between layers: over max_payload_mb, "
            f"{format_bytes(self.max_payload)})"
            if self.split
            else ""
        )
        out = [
            f"on the NDIF server {self.host} (nothing is sent by this plan):",
            f"  model key: {key}",
            f"  runs: {self.rows} rows in {self.batches} forward passes of up to "
            f"{self.batch_size} rows x {self.tokens} tokens, {bound}{self.requests} "
            f"requests{split}; its memory is the server's",
        ]
        other = f"about {format_bytes(self.other_total)} of token ids, masks and trace code"
        if self.split:
            other += " (and the residual streams between layer blocks)"
        if self.donor_mode == "hosted":
            out.append(
                f"  sent (donor_mode hosted): no weights, the donors' module paths in the "
                f"server's graft pair; {other} in all"
            )
        else:
            out.append(
                f"  sent (donor_mode ship): the donor modules of the grafted cells, "
                f"{bound}{format_bytes(self.payload_max)} a request, "
                f"{bound}{format_bytes(self.payload_total)} in all; plus {other}"
            )
        if self.refused:
            out.append(f"  refused before sending: {self.refused}")
        out.append(
            f"  returned: {2 + 2 * RETURNED_TOP_K} numbers a row (the target's log-probability "
            f"and rank, the top {RETURNED_TOP_K} tokens and theirs), not logits"
        )
        return out + [f"  {note}" for note in self.notes]


def planned_model_key(
    remote: RemoteConfig, hub_id: str | None, base: str
) -> tuple[str | None, str | None]:
    """``(model key, None)`` as the run derives it (:meth:`RemoteConfig.resolved_model_key`),
    or ``(None, why and the fix)``; ``hub_id``: the base's hub id, None when the run loads
    it from a folder (``base``: what it is, in words)."""
    if remote.model_key:
        return remote.model_key, None
    if hub_id is None:
        return None, (
            f"the base is {base}, not a hub id, so the key the server knows it by cannot be "
            "derived: set model_key"
        )
    if remote.donor_mode == "hosted":
        if not remote.hosted_donors:
            return None, "hosted mode needs the graft pair's key: set model_key or hosted_donors"
        from graft.remote.hosted import hosted_model_key

        return hosted_model_key(hub_id, remote.hosted_donors), None
    return hf_model_key(hub_id), None


def plan_remote(
    remote: RemoteConfig,
    config: Any,
    dtype: str,
    grafts: Sequence[NamedGraft],
    batches: Sequence[BatchShape],
    tokens: int,
    model_key: tuple[str | None, str | None],
) -> RemotePlan:
    """The server's part of a remote run of ``grafts`` in ``batches`` on a model of
    ``config`` (transformers config; donors in ``dtype``); ``tokens``: the longest prompt;
    ``model_key``: :func:`planned_model_key`'s answer."""
    import torch

    from graft.core.families.arch import architecture_of
    from graft.models.paper import meta_model
    from graft.remote import blocks
    from graft.remote.payload import keyed_bytes, spec_module_paths

    model = meta_model(config)
    arch = architecture_of(model)
    torch_dtype = getattr(torch, dtype)
    itemsize = torch_dtype.itemsize
    embed = model.get_submodule(arch.table.embed_sites[0].path)
    hidden = int(cast(torch.Tensor, embed.weight).shape[-1])
    per_graft = [spec_module_paths(arch, g.spec) for g in grafts]
    every = frozenset(range(len(grafts)))
    hosted = remote.donor_mode == "hosted"

    def size_of(keys: Iterable[Key]) -> int:
        return keyed_bytes(keys, lambda _d, path: model.get_submodule(path), torch_dtype)

    plan = RemotePlan(
        host=remote.resolved_host(),
        model_key=model_key[0],
        key_problem=model_key[1],
        donor_mode=remote.donor_mode,
        rows=sum(b.rows for b in batches),
        batches=len(batches),
        batch_size=max((b.rows for b in batches), default=0),
        tokens=tokens,
        exact=all(b.grafts is not None for b in batches),
        max_payload=remote.max_payload_bytes,
    )
    sized: dict[frozenset[int], tuple[set[Key], int]] = {}
    for batch in batches:
        which = every if batch.grafts is None else batch.grafts
        if which not in sized:
            keys = set().union(*(per_graft[i] for i in which))
            sized[which] = (keys, 0 if hosted else size_of(keys))
        keys, payload = sized[which]
        length = batch.tokens or tokens
        masks = len(keys) * batch.rows * length  # a patch's [rows, positions] bools
        inputs = batch.rows * length * _INPUT_BYTES + masks + blocks.TRACE_BYTES
        if payload <= remote.max_payload_bytes:
            plan.requests += 1
            plan.payload_total += payload
            plan.payload_max = max(plan.payload_max, payload)
            plan.other_total += inputs
            continue
        residual = batch.rows * length * hidden * itemsize
        reserve = residual + masks + blocks.TRACE_BYTES  # the executor's budget rule
        found = _split(arch, keys, size_of, remote.max_payload_bytes - reserve, remote)
        if isinstance(found, str):
            plan.refused = plan.refused or found
            continue
        plan.split += 1
        plan.requests += len(found)
        plan.payload_total += sum(b.payload for b in found)
        plan.payload_max = max([plan.payload_max, *(b.payload for b in found)])
        plan.other_total += len(found) * inputs + (len(found) - 1) * residual
    return plan


def _split(
    arch: Architecture,
    keys: set[Key],
    size_of: Callable[[Iterable[Key]], int],
    budget: int,
    remote: RemoteConfig,
) -> list[Block] | str:
    """The layer blocks of a batch over the limit (the executor's rule), or the one-line
    refusal the run would meet."""
    from graft.remote import blocks
    from graft.remote.payload import format_bytes

    if budget <= 0:
        return (
            f"a request of at most {format_bytes(remote.max_payload_bytes)} has no room for "
            "donor weights beside the trace and the residual stream: raise max_payload_mb, "
            "lower batch_size, or use donor_mode='hosted'"
        )
    stages: dict[int, set[Key]] = {}
    for key in keys:
        stages.setdefault(blocks.stage_of(arch, key[1]), set()).add(key)
    try:
        return blocks.plan_blocks(arch, stages, size_of, budget, remote.max_payload_bytes)
    except RemoteError as err:
        return str(err)
