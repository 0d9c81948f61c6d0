"""What a grafted trace adds to nnsight's for its users: rows with their own grafts added by
``g.invoke(text, spec)`` (:class:`InvokeRows`, planned as one batch by :class:`InvokeBatcher`
once the block collected them; :class:`GraftInvoke` is one such block), and eager attention
for one trace (:class:`AttentionSwitch`). Local only: a server's trace is planned on the
client and runs :mod:`graft.core.api.tracer` alone."""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from nnsight.intervention.batching import Batcher
from nnsight.intervention.tracer import Invoker

from graft.core.api.texts import _prompt_list, _rows, _spec_list, is_one_prompt, is_one_spec
from graft.core.families.arch import architecture_of
from graft.core.planning.plan import GraftRow
from graft.errors import TraceError

#: Plans rows as one batch: the trace's batch, the donor modules and the padded spans.
Planner = Callable[[list[GraftRow]], tuple[types.SimpleNamespace, Any, list[dict[str, list[int]]]]]


class AttentionSwitch:
    """The base run with eager attention (whose modules return their probabilities) for one
    trace; :meth:`restore` puts the implementation it had back."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.before = getattr(model.config, "_attn_implementation", None)
        setter = getattr(model, "set_attn_implementation", None)
        if setter is None:
            raise TraceError(
                "attention=True needs a transformers model with set_attn_implementation "
                "(transformers >= 4.56)"
            )
        setter("eager")
        self.set_implementation: Callable[[str], None] = setter
        self.arch = architecture_of(model)

    def path(self, layer: int) -> str:
        """The attention module of ``layer`` (the parent of its ``o`` projection)."""
        if not -self.arch.n_layers <= layer < self.arch.n_layers:
            raise TraceError(f"layer {layer} out of range: the model has {self.arch.n_layers}")
        return self.arch.site_for(layer % self.arch.n_layers, "o")[0].rsplit(".", 1)[0]

    def restore(self) -> None:
        if self.before is not None:
            self.set_implementation(self.before)


class InvokeRows:
    """The rows ``g.invoke(text, spec)`` added to a trace opened without texts, planned as one
    batch when the model is about to run."""

    def __init__(self, tokenizer: Any, planner: Planner) -> None:
        self.tokenizer, self.planner = tokenizer, planner
        self.rows: list[GraftRow] = []

    def add(self, text: Any, spec: Any, fields: Mapping[str, Any] | None) -> int:
        """Tokenize one invoke's row now (bad input fails at the ``g.invoke`` line)."""
        if not is_one_prompt(text) or not is_one_spec(spec):
            raise TraceError(
                "g.invoke(text, spec) adds one row: give one prompt (a string or its token "
                "ids) and one graft (a spec text, a graft.Graft or a GraftSpec); use one "
                "invoke per row"
            )
        (prompt,) = _prompt_list(text)
        (row,) = _rows(self.tokenizer, [prompt], _spec_list(spec), [fields or {}])
        self.rows.append(row)
        return len(self.rows) - 1

    def plan(self) -> tuple[types.SimpleNamespace, Any, list[dict[str, list[int]]]]:
        if not self.rows:
            raise TraceError("a graft.trace without texts needs `with g.invoke(text, spec):`")
        return self.planner(self.rows)


@dataclass(frozen=True)
class _InvokeRow:
    """What an invoke hands nnsight's batcher: its row's index."""

    index: int


class InvokeBatcher(Batcher):
    """nnsight's batcher for a trace whose rows come from ``g.invoke``: one row per invoke,
    and the combined input is the graft's planned batch (left-padded, with position ids)."""

    def __init__(self, trace: Any, envoy: Any, kwargs: Any) -> None:
        Batcher.__init__(self, envoy, kwargs)
        self.trace = trace

    def add(self, *inputs: Any, **kwargs: Any) -> Any:
        if inputs and isinstance(inputs[0], _InvokeRow):
            group = [self.total, 1]
            self.total += 1
            self.invokes.append((inputs, kwargs))
            return group
        if inputs or kwargs:
            raise TraceError("rows of a graft.trace without texts come from g.invoke(text, spec)")
        return None

    def assemble(self, fn: Any) -> tuple:
        self.trace.plan_invokes()
        return (), dict(self.trace.batch.inputs)


class GraftInvoke(Invoker):
    """``with g.invoke(text, spec) as row:``: the block sees its row only; ``row.logits``
    is the row's last-position logits ([1, vocab]; after the block too), ``row.spans`` its
    named spans in the padded batch."""

    def __init__(self, trace: Any, index: int) -> None:
        Invoker.__init__(self, trace, _InvokeRow(index))
        self.index = index

    @property
    def logits(self) -> Any:
        trace = self.tracer
        if trace._state == "done":
            return trace.logits[self.index : self.index + 1]
        return trace.envoy.output.logits[:, -1]  # left padding: every row ends at -1

    @property
    def spans(self) -> dict[str, list[int]]:
        self.tracer._planned()
        return self.tracer.spans[self.index]
