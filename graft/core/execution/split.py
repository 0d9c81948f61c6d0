"""Grafted matrix products split where it pays: a grafted module's own weights run only on
the cells no donor takes (:func:`split_modules`, which the local executor's trace and hooked
graft skip and run on those cells), when donors take enough of its cells for the gathers and
copies the split adds to cost less than the work it saves."""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from graft.core.execution.module_tables import ModuleTable

#: A module's own computation is restricted to the cells no donor takes when donors take at
#: least this share of the cells it sees (below, copying the rest costs more than it saves)
#: and the module's input has at least :data:`SPLIT_MIN_FEATURES` features ...
SPLIT_SHARE = 0.125
#: ... A narrower product is split only when donors take at least :data:`SPLIT_SHARE_MOST`
#: of its cells (below, its own work on the rest costs less than the gathers and the copy
#: of its output the split adds: at 64 features, 2 of 15 positions grafted, a split
#: Linear(64, 256) took 640 us and the whole product plus the donor's cells 360 us on the
#: 2-core CPU); so is every product on a GPU, where one of these sizes costs about as much
#: as launching the split's three extra kernels.
SPLIT_MIN_FEATURES = 256
SPLIT_SHARE_MOST = 0.5


def _multiplies(module: nn.Module) -> bool:
    """Whether ``module`` is a matrix product (a linear layer or GPT-2's Conv1D), the kind
    of module whose work is worth restricting to some cells."""
    weight = getattr(module, "weight", None)
    return (
        isinstance(weight, torch.Tensor)
        and weight.dim() == 2
        and not isinstance(module, nn.Embedding)
    )


def _in_features(module: nn.Module) -> int:
    """Input features of a matrix product (:func:`_multiplies`): a Linear's weight is [out,
    in], GPT-2's Conv1D's [in, out]."""
    weight = cast(torch.Tensor, module.weight)
    return int(weight.shape[1] if isinstance(module, nn.Linear) else weight.shape[0])


def _split_share(module: nn.Module) -> float | None:
    """The share of its cells donors must take for ``module``'s own work to be split off
    (:data:`SPLIT_SHARE`, or :data:`SPLIT_SHARE_MOST` for a narrow product or on a GPU);
    None: never (not a matrix product)."""
    if not _multiplies(module):
        return None
    narrow = _in_features(module) < SPLIT_MIN_FEATURES
    if narrow or cast(torch.Tensor, module.weight).device.type == "cuda":
        return SPLIT_SHARE_MOST
    return SPLIT_SHARE


def split_modules(
    torch_model: nn.Module, batch, table: ModuleTable | None = None
) -> dict[str, tuple]:
    """``{path: (module, bool [batch, positions] of the cells no patch covers, their flat
    indices)}`` for the grafted matrix products of ``batch`` where donors take at least
    :data:`SPLIT_SHARE` of the cells: the trace skips them and runs them on those cells
    only (:func:`graft.core.execution.trace.graft_trace_body`). ``table``: the model's
    :func:`~graft.core.execution.module_tables.module_table`, if at hand.
    Fused q/k/v sites grafted in slices keep the whole computation (the base's slices are
    needed at the grafted cells too)."""
    head = torch_model.get_output_embeddings()  # type: ignore[operator]  # a transformers model
    last_only = "logits_to_keep" in batch.inputs
    groups: dict[str, list] = {}
    for patch in batch.patches:
        groups.setdefault(patch.path, []).append(patch)
    split = {}
    kept: dict[tuple, tuple] = {}  # (mask id, share) -> (that mask, keep, its indices)
    for path, patches in groups.items():
        if any((p.fused and p.slices) or p.seq_dim != 1 for p in patches):
            continue
        module = table[path] if table is not None else torch_model.get_submodule(path)
        share = _split_share(module)
        if share is None:
            continue
        taken = patches[0].rows
        for p in patches[1:]:
            taken = taken | p.rows
        if module is head and last_only:
            taken = taken[:, -1:]
        known = kept.get((id(taken), share))
        if known is None:
            keep = None
            if taken.float().mean() >= share:
                keep = ~taken
                keep = (keep, keep.flatten().nonzero().squeeze(1))
            known = kept[id(taken), share] = (taken, keep)
        if known[1] is not None:
            split[path] = (module, *known[1])
    return split
