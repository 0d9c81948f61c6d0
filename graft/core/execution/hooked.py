"""The local executor's graft without a trace: the grafted modules' forwards replaced for
one forward pass, every other module left as it is.

An nnsight trace serves every module of the model through its interleaver, grafted or not,
and runs the graft's intervention code beside the forward; on a fast device that host work,
not the kernels, sets the pace (the plain forward of a narrow or short batch is itself
mostly host work). Locally graft needs none of it: :func:`grafted_forwards` puts, for the
duration of one forward, a forward of its own on each grafted module only, which runs
:func:`graft.core.execution.trace.graft_cells` -- the very code the trace runs at that module -- on
the module's input and output. The numbers are those of the traced graft bit for bit
(tested); nnsight stays for ``graft.trace``, remote runs and what users script.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from graft.core.execution.head import check_unchanged, head_inputs
from graft.core.execution.trace import (
    DonorModules,
    OwnCells,
    graft_cells,
    last_logits,
    module_groups,
    note_module_error,
    row_metrics,
)

_ABSENT = object()


def _grafting_forward(
    inner: Any,
    patches: list[types.SimpleNamespace],
    donor_modules: DonorModules,
    own: OwnCells | None,
    gathered: dict,
) -> Any:
    """A forward for the module of ``patches``: the graft of :func:`graft_cells`, around the
    module's own forward ``inner`` (not called where ``own`` computes its cells)."""

    def forward(*args: Any, **kwargs: Any) -> torch.Tensor:
        x_all = args[0] if args else next(iter(kwargs.values()))
        try:
            return graft_cells(
                patches, donor_modules, own, gathered, x_all, lambda: inner(*args, **kwargs)
            )
        except Exception as exc:
            note_module_error(exc, patches)
            raise

    return forward


@contextlib.contextmanager
def grafted_forwards(
    model: nn.Module,
    patches: Sequence[types.SimpleNamespace],
    donor_modules: DonorModules,
    split: Mapping[str, OwnCells] | None = None,
    table: Mapping[str, nn.Module] | None = None,
) -> Iterator[None]:
    """Within the block, a forward of ``model`` applies ``patches`` (a planned batch's, as
    :func:`graft.core.execution.trace.trace_batch` makes them; ``split`` as for
    :func:`graft.core.execution.trace.graft_trace_body`). Each grafted module's ``forward`` is set
    on the instance for the block and put back after, whatever it was (nnsight keeps its own
    controller there). ``table``: ``model``'s modules by path, if at hand."""
    gathered: dict = {}  # shared by the modules: q/k/v and gate/up gather their input once
    saved: list[tuple[nn.Module, Any]] = []
    try:
        for group in module_groups(patches):
            path = group[0].path
            module = table[path] if table is not None else model.get_submodule(path)
            saved.append((module, module.__dict__.get("forward", _ABSENT)))
            own = split.get(group[0].path) if split else None
            module.forward = _grafting_forward(module.forward, group, donor_modules, own, gathered)
        yield
    finally:
        for module, before in reversed(saved):
            if before is _ABSENT:
                del module.__dict__["forward"]
            else:
                module.__dict__["forward"] = before
        gathered.clear()


def run_hooked(
    model: nn.Module,
    batch: types.SimpleNamespace,
    donor_modules: DonorModules,
    split: Mapping[str, OwnCells] | None = None,
    table: Mapping[str, nn.Module] | None = None,
    head: nn.Module | None = None,
) -> torch.Tensor:
    """What :func:`graft.core.execution.trace.graft_batch` returns for ``batch``, computed by one
    plain forward of ``model`` with :func:`grafted_forwards` (``table``: its modules by path, if
    at hand): each row's last-position logits, or with ``batch.targets`` its metrics.
    ``head``: the model's head, which ``batch`` does not graft: return each row's input to it
    at the last position instead of its logits (:mod:`graft.core.execution.head`; raises
    :class:`graft.core.execution.head.HeadOutputChanged` where the model changes the head's
    output)."""
    grafted = grafted_forwards(model, batch.patches, donor_modules, split, table)
    capture = head_inputs(head) if head is not None else contextlib.nullcontext()
    with torch.no_grad(), grafted, capture as seen:
        full = model(**batch.inputs).logits
    if seen is not None:
        check_unchanged(full, seen)
    picked = last_logits(full, batch)
    if batch.targets is None:
        return picked
    return row_metrics(picked, batch.targets, batch.top_k)
