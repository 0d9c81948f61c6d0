"""The tracer of ``graft.trace``: :class:`GraftedTrace`, an nnsight ``InterleavingTracer`` over
the base whose run applies the graft (made by :func:`graft.core.api.grafted_trace.trace`).
Beside the user's block, a second intervention block runs
:func:`graft.core.execution.trace.graft_trace_body`, the engine's own trace code, on the
whole batch.

Order: nnsight serves the blocks parked on one module in the order they were registered,
and the graft's block is registered first. So at a grafted module the graft writes the
donor's cells into the output before the user's block is served: a user's read of that
output sees the grafted value, and a user's write lands after (on top of) the graft.
A module the graft does not touch is the base's, as in a plain trace.

Remote runs send the tracer itself: this module travels by value (:func:`register_by_value`)
so that :meth:`GraftedTrace.execute`, which adds the graft's block, runs on the server. The
class uses nothing of ``graft`` but :mod:`graft.core.execution.trace`, itself sent by value.
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from nnsight.intervention.interleaver import Mediator
from nnsight.intervention.tracer import InterleavingTracer

from graft.core.execution.trace import DonorModules, graft_trace_body, last_logits

__all__ = ["GraftedTrace", "register_by_value", "trace_error"]

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


def trace_error(message: str) -> Exception:
    """A :class:`graft.errors.TraceError`, imported when raised (a server has no graft)."""
    from graft.errors import TraceError

    return TraceError(message)


def register_by_value() -> None:
    """Send this module's code by value with remote traces (nnsight's cloudpickle registry)."""
    import nnsight

    nnsight.register(__name__)


class GraftedTrace(InterleavingTracer):
    """An nnsight trace of the base in which the graft is applied; made by
    :func:`graft.core.api.grafted_trace.trace`.

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
            raise trace_error(
                "g.invoke() needs its row's prompt: g.invoke(text, spec); to read the whole "
                "batch, use g.model in the trace's block outside any invoke"
            )
        if self.invoke_rows is None:
            raise trace_error(
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
        return trace_error(
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
            raise trace_error(
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
                raise trace_error(
                    "no logits: the block stopped the model before its output (g.stop()), "
                    "or the trace ran on a server; save g.logits inside the block"
                )
            return self.kept_logits
        if self.invoke_rows is not None:
            raise trace_error("inside an invoke read row.logits (with g.invoke(...) as row:)")
        return last_logits(self.envoy.output.logits, self._planned())

    def attention(self, layer: int) -> Any:
        """Inside the block: the attention probabilities of ``layer`` [rows, heads, query
        positions, key positions] (padding columns are 0), as the grafted run computed them.
        Needs ``graft.trace(..., attention=True)``."""
        if self._attention is None:
            raise trace_error(
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
            raise trace_error(
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
            raise trace_error(
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
