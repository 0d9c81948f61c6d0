"""``graft.trace``: the graft as an nnsight trace the user writes into.

:func:`trace` plans the rows (a prompt per row, or the rows ``g.invoke`` adds) and returns a
:class:`~graft.core.api.tracer.GraftedTrace`, an nnsight ``InterleavingTracer`` over the
base whose run applies the graft. The body of the user's ``with`` block is an ordinary
nnsight trace body (``g.model`` is the base's envoy: every module path, ``.input``,
``.output``, ``.save()`` and assignment works as in ``model.trace``); the tracer's module
says in which order the graft and the user's block are served.

What a user trace does not do (the engine's shortcuts would change what the user sees):
no carrier routing (the base carries every row), no shared prefixes (every row runs its
whole prompt), no split matrix products (every grafted module computes all its cells, then
the donors' cells are written over them) and no ``logits_to_keep`` (the head computes every
position's logits; a ``head=`` policy grafts the last position's only). This is the plain
one-pass graft a remote executor runs; its last-position logits equal ``graft_texts``' to
float rounding (the engine's 1e-5 in float32).
"""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from graft.core.api import texts as api_texts
from graft.core.api.tracer import GraftedTrace, trace_error
from graft.core.execution.engine import _plans, checked_inputs
from graft.core.execution.executor import Executor, LocalExecutor
from graft.core.execution.trace import DonorModules, trace_batch
from graft.core.families.wrapping import unwrap, wrap
from graft.core.language.graft_object import Graft
from graft.core.language.spec import GraftSpec
from graft.core.planning.plan import GraftRow
from graft.errors import SpecError

__all__ = ["GraftedTrace", "trace", "trace_rows"]


def trace(
    base: Any,
    donors: Any,
    tokenizer: Any,
    texts: api_texts.Prompts | None = None,
    specs: Sequence[GraftSpec | Graft | str] | GraftSpec | Graft | str = "none",
    *,
    fields: Sequence[Mapping[str, str]] | Mapping[str, str] | None = None,
    pad_id: int | None = None,
    executor: Executor | None = None,
    grad: bool = False,
    attention: bool = False,
) -> GraftedTrace:
    """The graft as an nnsight trace: ``with graft.trace(...) as g:``.

    Inside the block, ``g.model`` is the base's nnsight envoy in a trace where the graft is
    applied; every module path, ``.input``, ``.output``, ``.save()`` and assignment works as
    in a plain ``model.trace``. A read of a grafted module's output sees the grafted value;
    a write to it lands after the graft. ``g.logits`` is each row's last-position logits
    (readable after the block too).

    Args:
        base, donors, tokenizer, fields: as for :func:`graft.core.api.texts.graft_texts`.
        texts: a prompt (a text or its token ids, as for ``graft_texts``), or a list of
            them: the rows of the batch, in order. None: the rows come from ``with
            g.invoke(text, spec):`` blocks, each its own graft, as nnsight's ``tracer.invoke``.
        specs: one graft (a spec text, a ``graft.Graft`` or a ``GraftSpec``) for every
            text, a list of one per text, or, with a single text, a list of several: one
            row of that text per graft.
        pad_id: id used for padding (default: the tokenizer's pad id, else the config's).
        executor: where the trace runs: None or a ``LocalExecutor`` (this machine; its
            shortcuts do not apply), or a ``graft.remote.executor.RemoteExecutor`` (an
            NDIF server, or its simulation).
        grad: keep autograd's graph: ``.grad`` of saved values and ``loss.backward()``
            inside the block work as in a plain nnsight trace (local runs).
        attention: run the base with eager attention for this trace, so that
            ``g.attention(layer)`` reads the attention probabilities (put back after).

    Returns:
        the :class:`GraftedTrace`, to be entered with ``with``.
    """
    tokenizer = api_texts._tokenizer(base, tokenizer)
    if texts is None:
        return _invoke_trace(base, donors, tokenizer, pad_id, executor, grad, attention)
    text_list = api_texts._prompt_list(texts)
    spec_list = api_texts._spec_list(specs)
    if len(spec_list) == 1 and api_texts.is_one_spec(specs):
        spec_list = spec_list * len(text_list)
    elif len(text_list) == 1 and api_texts.is_one_prompt(texts):
        text_list = text_list * len(spec_list)  # one text, one row per graft
        if isinstance(fields, Mapping):
            fields = [fields] * len(spec_list)
    if len(spec_list) != len(text_list):
        raise SpecError(
            f"specs: one spec for every text, or a list of one spec per text ({len(text_list)}), "
            f"not {len(spec_list)}"
        )
    field_list = api_texts._field_list(fields, text_list)
    rows = [
        api_texts._rows(tokenizer, [text], [spec], [named])[0]
        for text, spec, named in zip(text_list, spec_list, field_list, strict=True)
    ]
    if pad_id is None:
        pad_id = getattr(tokenizer, "pad_token_id", None)
    return trace_rows(
        base, donors, rows, pad_id=pad_id, executor=executor, grad=grad, attention=attention
    )


def trace_rows(
    base: Any,
    donors: Any,
    rows: Sequence[GraftRow],
    *,
    pad_id: int | None = None,
    executor: Executor | None = None,
    grad: bool = False,
    attention: bool = False,
) -> GraftedTrace:
    """:func:`trace` on ``GraftRow``s (token ids, token spans, spec), one batch in order."""
    executor = LocalExecutor() if executor is None else executor
    batch, donor_modules, spans, setup = _plan_rows(base, donors, rows, pad_id, executor)
    switch = _check_options(base, setup.backend, grad, attention)
    return GraftedTrace(setup.model, batch, donor_modules, spans, setup.backend, grad, switch)


def _check_options(base: Any, backend: Any, grad: bool, attention: bool) -> Any:
    """Refuse what a server's trace cannot do; switch the base to eager attention if asked."""
    if backend is not None and (grad or attention):
        raise trace_error(
            "grad=True and attention=True run locally: a server's trace returns saved "
            "values only; drop them or use the local executor"
        )
    if not attention:
        return None
    from graft.core.api.trace_invokes import AttentionSwitch

    return AttentionSwitch(unwrap(base))


def _plan_rows(
    base: Any, donors: Any, rows: Sequence[GraftRow], pad_id: int | None, executor: Executor | None
) -> tuple[types.SimpleNamespace, DonorModules, list[dict[str, list[int]]], Any]:
    """``rows`` as one planned batch: the trace's batch, donor modules, padded spans, and
    the executor's trace parts."""
    rows = list(rows)
    if not rows or not all(isinstance(r, GraftRow) for r in rows):
        raise SpecError("rows must be a non-empty list of GraftRow objects")
    base, donors, arch, same, pad_id, resolved = checked_inputs(base, donors, rows, pad_id)
    torch_base = unwrap(base)
    batch_rows = [list(range(len(rows)))]
    (plan,) = _plans(
        arch, rows, resolved, batch_rows, pad_id=pad_id, padding_side="left", skip=same
    )
    plan.keep_last_only = False  # every position's logits, as a plain trace computes them
    parts = getattr(executor, "trace_parts", None)
    if parts is None:
        raise SpecError(
            f"executor {type(executor).__name__} cannot run a trace; use a LocalExecutor or a "
            "RemoteExecutor"
        )
    setup = parts(base, donors, plan.patches)
    batch = trace_batch(plan, torch_base, setup.device)
    spans = _padded_spans(rows, plan.last_index)
    return batch, setup.donor_modules, spans, setup


def _padded_spans(rows: Sequence[GraftRow], last_index: torch.Tensor) -> list[dict[str, list[int]]]:
    """Each row's named spans, and ``LT``, as positions in the left-padded batch."""
    out = []
    for row, last in zip(rows, last_index.tolist(), strict=True):
        offset = last - (len(row.input_ids) - 1)
        spans = {name: [p + offset for p in pos] for name, pos in row.spans.items()}
        spans["LT"] = [last]
        out.append(spans)
    return out


def _invoke_trace(
    base: Any,
    donors: Any,
    tokenizer: Any,
    pad_id: Any,
    executor: Executor | None,
    grad: bool,
    attention: bool,
) -> GraftedTrace:
    executor = LocalExecutor() if executor is None else executor
    if not isinstance(executor, LocalExecutor):
        raise trace_error("g.invoke(...) runs locally: give texts to trace on a server")
    if pad_id is None:
        pad_id = getattr(tokenizer, "pad_token_id", None)
    switch = _check_options(base, None, grad, attention)  # invokes run locally
    g = GraftedTrace(wrap(base), None, {}, [], None, grad, switch)

    def plan(rows: list[GraftRow]) -> tuple:
        return _plan_rows(base, donors, rows, pad_id, executor)[:3]

    from graft.core.api.trace_invokes import InvokeRows

    g.invoke_rows = InvokeRows(tokenizer, plan)
    return g
