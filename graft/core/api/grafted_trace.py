"""``graft.trace``: the graft as an nnsight trace the user writes into.

:func:`trace` returns a :class:`GraftedTrace`, an nnsight ``InterleavingTracer`` over the
base whose run applies the graft. The body of the user's ``with`` block is an ordinary
nnsight trace body (``g.model`` is the base's envoy: every module path, ``.input``,
``.output``, ``.save()`` and assignment works as in ``model.trace``); beside it, a second
intervention block runs :func:`graft.core.execution.trace.graft_trace_body`, the engine's own trace
code, on the whole batch.

Order: nnsight serves the blocks parked on one module in the order they were registered,
and the graft's block is registered first. So at a grafted module the graft writes the
donor's cells into the output before the user's block is served: a user's read of that
output sees the grafted value, and a user's write lands after (on top of) the graft.
A module the graft does not touch is the base's, as in a plain trace.

What a user trace does not do (the engine's shortcuts would change what the user sees):
no carrier routing (the base carries every row), no shared prefixes (every row runs its
whole prompt), no split matrix products (every grafted module computes all its cells, then
the donors' cells are written over them) and no ``logits_to_keep`` (the head computes every
position's logits; a ``head=`` policy grafts the last position's only). This is the plain
one-pass graft a remote executor runs; its last-position logits equal ``graft_texts``' to
float rounding (the engine's 1e-5 in float32).

Remote runs send the tracer itself: this module travels by value (:func:`register_by_value`)
so that :meth:`GraftedTrace.execute`, which adds the graft's block, runs on the server. The
class uses nothing of ``graft`` but :mod:`graft.core.execution.trace`, itself sent by value.
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from nnsight.intervention.interleaver import Mediator
from nnsight.intervention.tracer import InterleavingTracer

from graft.core.api import texts as api_texts
from graft.core.execution.engine import _plans, checked_inputs
from graft.core.execution.executor import Executor, LocalExecutor
from graft.core.execution.trace import DonorModules, graft_trace_body, last_logits, trace_batch
from graft.core.families.wrapping import unwrap, wrap
from graft.core.language.graft_object import Graft
from graft.core.language.spec import GraftSpec
from graft.core.planning.plan import GraftRow
from graft.errors import SpecError

__all__ = ["GraftedTrace", "register_by_value", "trace", "trace_rows"]

#: The graft's intervention block, compiled where it runs (a server rebuilds the tracer).
#: After ``g.stop()`` the modules past the stop are never reached: nnsight then throws an
#: out-of-order error into the graft's block, which is no error there.
_GRAFT_SOURCE = """
try:
    if batch is None:  # rows added by invokes: planned once they were all collected
        batch, donor_modules = trace.batch, trace.donor_modules
    graft_trace_body(model, batch.patches, donor_modules, None, grad)
    if keep_logits:
        trace.kept_logits = last_logits(model.output.logits, batch).detach()
except Exception:
    if not trace.stopped:
        raise
"""


def _trace_error(message: str) -> Exception:
    """A :class:`graft.errors.TraceError`, imported when raised (a server has no graft)."""
    from graft.errors import TraceError

    return TraceError(message)


def register_by_value() -> None:
    """Send this module's code by value with remote traces (nnsight's cloudpickle registry)."""
    import nnsight

    nnsight.register(__name__)


class GraftedTrace(InterleavingTracer):
    """An nnsight trace of the base in which the graft is applied; made by :func:`trace`.

    Use it as ``with graft.trace(...) as g:``; inside the block ``g.model`` is the base's
    nnsight envoy and ``g.logits`` each row's last-position logits. The rows are one padded
    batch (left padding, explicit position ids): position ``-1`` is every row's last token.

    Attributes:
        batch: the planned batch (:func:`graft.core.execution.trace.trace_batch`): ``inputs`` (the
            forward's keyword arguments: ``input_ids``, ``attention_mask``,
            ``position_ids``), ``patches`` (the grafted modules' masks), ``pick`` (each
            row's last index).
        donor_modules: ``"donor:path"`` -> the donor module the graft calls there (or, for
            a hosted graft pair, its envoy path).
        spans: per row, each named span's positions in the padded batch (``LT`` included).
        stopped: whether the block called :meth:`stop`.
        grad: the trace keeps autograd's graph (``graft.trace(..., grad=True)``).
        kept_logits: after the block, each row's last-position logits as the model computed
            them (what :attr:`logits` returns then); None before, or when the block stopped
            the model first.
    """

    # No zero-argument super() here: a class sent by value is rebuilt from its source,
    # where the ``__class__`` cell that super() needs does not exist.

    def __init__(
        self,
        model: Any,
        batch: types.SimpleNamespace | None,
        donor_modules: DonorModules,
        spans: list[dict[str, list[int]]],
        backend: Any = None,
        grad: bool = False,
        attention: Any = None,
    ) -> None:
        # what ``model.trace`` runs (TransformersModel's bound ``_call``), not the name
        # "__call__": nnsight resolves a name against the torch module, but ndif 0.1.2's
        # sandbox resolves it against the server's envoy, whose ``__call__`` runs the
        # forward without serving any intervention (every read was "out of order")
        fn = getattr(model, "_call", None)
        if fn is None:  # an nnsight without it: local traces work, ndif's sandbox may not
            warnings.warn(
                "this nnsight's model has no _call; graft.trace falls back to '__call__', "
                "which ndif 0.1.2's sandbox does not serve (remote reads may go unanswered)",
                stacklevel=2,
            )
            fn = "__call__"
        inputs = {} if batch is None else batch.inputs  # None: rows come from g.invoke
        InterleavingTracer.__init__(self, model, fn, backend=backend, **inputs)
        self.batch = batch
        self.donor_modules = donor_modules
        self.spans = spans
        self.stopped = False
        self.grad = grad
        self.local = backend is None  # a server's copy of the trace hands back no logits
        self.kept_logits: torch.Tensor | None = None
        self._attention = attention  # how to put the base's attention back, or None
        self._state = "new"  # new -> done (after the block)
        self.invoke_rows: Any = None  # the InvokeRows of graft.trace without texts

    # nnsight's execute() makes a Batcher for the trace's invokes; in invoke mode it is
    # replaced by one that plans the graft once every invoke is collected
    @property
    def batcher(self) -> Any:
        return self.__dict__.get("_batcher")

    @batcher.setter
    def batcher(self, value: Any) -> None:
        rows = self.__dict__.get("invoke_rows")
        if value is not None and rows is not None:
            from graft.core.api.trace_invokes import InvokeBatcher  # local: not on a server

            value = InvokeBatcher(self, value.envoy, value.kwargs)
        self.__dict__["_batcher"] = value

    def invoke(  # nnsight's invoke takes the forward's inputs; this one a prompt and a graft
        self, text: Any = None, spec: Any = "none", *, fields: Mapping[str, Any] | None = None
    ) -> Any:
        """One row of the batch with its own graft: ``with g.invoke(text, spec) as row:``
        (``text``: a prompt string or its token ids). Inside, reads and writes see this row
        only (as in nnsight's ``tracer.invoke``), and ``row.logits`` is its last-position
        logits. Only in ``graft.trace(base, donors, tokenizer)`` opened without texts."""
        if text is None:  # nnsight's empty invoke (the whole batch) has no graft row
            raise _trace_error(
                "g.invoke() needs its row's prompt: g.invoke(text, spec); to read the whole "
                "batch, use g.model in the trace's block outside any invoke"
            )
        if self.invoke_rows is None:
            raise _trace_error(
                "g.invoke(...) adds rows to a trace opened without texts: "
                "with graft.trace(base, donors, tokenizer) as g: with g.invoke(text, spec): ..."
            )
        from graft.core.api.trace_invokes import GraftInvoke  # local: not on a server

        return GraftInvoke(self, self.invoke_rows.add(text, spec, fields))

    def plan_invokes(self) -> None:
        """Plan the graft of the rows the invokes added (nnsight calls this through the
        batcher, after the block collected them and before the model runs)."""
        assert self.invoke_rows is not None
        self.batch, self.donor_modules, self.spans = self.invoke_rows.plan()

    def _after_block(self, what: str) -> Exception:
        return _trace_error(
            f"g.{what} exists only inside the `with graft.trace(...) as g:` block; read "
            "values after it through what you .save()d there (g.logits stays readable)"
        )

    @property
    def model(self) -> Any:
        """The base's nnsight envoy (the same paths as ``model.trace``), inside the block."""
        if self._state == "done":
            raise self._after_block("model")
        return self.envoy

    def _planned(self) -> types.SimpleNamespace:
        if self.batch is None:
            raise _trace_error(
                "the rows of g.invoke(...) are planned when the model runs: read this inside "
                "an invoke's block"
            )
        return self.batch

    @property
    def inputs(self) -> dict[str, torch.Tensor]:
        """The batch as keyword arguments of the model's forward (a plain trace of the base
        on them, ``model.trace(**g.inputs)``, is this trace without the graft)."""
        return dict(self._planned().inputs)

    @property
    def logits(self) -> Any:
        """Each row's logits at its last position [rows, vocab], as ``graft_texts`` returns
        them. Inside the block a value of the trace (read it after every module the block
        reads); after the block the tensor the model computed (before any write of yours to
        the model's output)."""
        if self._state == "done":
            if self.kept_logits is None:
                raise _trace_error(
                    "no logits: the block stopped the model before its output (g.stop()), "
                    "or the trace ran on a server; save g.logits inside the block"
                )
            return self.kept_logits
        if self.invoke_rows is not None:
            raise _trace_error("inside an invoke read row.logits (with g.invoke(...) as row:)")
        return last_logits(self.envoy.output.logits, self._planned())

    def attention(self, layer: int) -> Any:
        """Inside the block: the attention probabilities of ``layer`` [rows, heads, query
        positions, key positions] (padding columns are 0), as the grafted run computed them.
        Needs ``graft.trace(..., attention=True)``."""
        if self._attention is None:
            raise _trace_error(
                "attention probabilities need eager attention: open the trace with "
                "graft.trace(..., attention=True)"
            )
        if self._state == "done":
            raise self._after_block("attention")
        return self.envoy.get(self._attention.path(layer)).output[1]

    def __exit__(self, *exc: Any) -> bool:
        """Run the block; then, like nnsight's tracer, hold no model weights (the donors'),
        and put the base's attention implementation back."""
        try:
            return InterleavingTracer.__exit__(self, *exc)
        except Exception as err:
            if self.grad or "require grad" not in str(err):  # not a backward with autograd off
                raise
            raise _trace_error(
                "a backward in this trace has no gradients to give: the graft runs without "
                "autograd unless opened with graft.trace(..., grad=True)"
            ) from err
        finally:
            self._state = "done"
            self.donor_modules = {}
            if self._attention is not None:
                self._attention.restore()

    def stop(self) -> None:
        """Halt the model run here (nnsight's ``tracer.stop()``); the graft stops with it."""
        self.stopped = True
        InterleavingTracer.stop(self)

    def execute(self, code: Any) -> None:
        """Register the graft's block ahead of the user's, then run the trace (with autograd
        only when opened with ``grad=True``)."""
        if self._state == "done":  # nnsight re-runs a tracer's captured block when re-entered
            raise _trace_error(
                "this graft.trace has already run; a trace runs once: call graft.trace(...) "
                "again for another run (values you .save()d in the first stay readable)"
            )
        graft = Mediator(
            compile(_GRAFT_SOURCE, "<graft>", "exec"),
            {"graft_trace_body": graft_trace_body, "last_logits": last_logits},
            {
                "model": self.envoy,
                "donor_modules": self.donor_modules,
                "trace": self,
                "grad": self.grad,
                "batch": self.batch,
                "keep_logits": self.local,
            },
        )
        self.envoy.interleaver.mediators.append(graft)  # the user's block comes after it
        with torch.enable_grad() if self.grad else torch.no_grad():
            InterleavingTracer.execute(self, code)


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
        raise _trace_error(
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
        raise _trace_error("g.invoke(...) runs locally: give texts to trace on a server")
    if pad_id is None:
        pad_id = getattr(tokenizer, "pad_token_id", None)
    switch = _check_options(base, None, grad, attention)  # invokes run locally
    g = GraftedTrace(wrap(base), None, {}, [], None, grad, switch)

    def plan(rows: list[GraftRow]) -> tuple:
        return _plan_rows(base, donors, rows, pad_id, executor)[:3]

    from graft.core.api.trace_invokes import InvokeRows

    g.invoke_rows = InvokeRows(tokenizer, plan)
    return g
