"""``graft.trace``: the graft as an nnsight trace the user writes into.

:func:`trace` returns a :class:`GraftedTrace`, an nnsight ``InterleavingTracer`` over the
base whose run applies the graft. The body of the user's ``with`` block is an ordinary
nnsight trace body (``g.model`` is the base's envoy: every module path, ``.input``,
``.output``, ``.save()`` and assignment works as in ``model.trace``); beside it, a second
intervention block runs :func:`graft.core.trace.graft_trace_body`, the engine's own trace
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
class uses nothing of ``graft`` but :mod:`graft.core.trace`, itself sent by value.
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from nnsight.intervention.interleaver import Mediator
from nnsight.intervention.tracer import InterleavingTracer

from graft.core.engine import _plans, checked_inputs
from graft.core.executor import LocalExecutor
from graft.core.plan import GraftRow
from graft.core.spec import GraftSpec
from graft.core.texts import _field_list, _rows, _spec_list, _text_list, _tokenizer
from graft.core.trace import DonorModules, graft_trace_body, last_logits, trace_batch
from graft.core.wrapping import unwrap
from graft.errors import SpecError

__all__ = ["GraftedTrace", "register_by_value", "trace", "trace_rows"]

#: The graft's intervention block, compiled where it runs (a server rebuilds the tracer).
#: After ``g.stop()`` the modules past the stop are never reached: nnsight then throws an
#: out-of-order error into the graft's block, which is no error there.
_GRAFT_SOURCE = """
try:
    graft_trace_body(model, patches, donor_modules)
except Exception:
    if not trace.stopped:
        raise
"""


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
        batch: the planned batch (:func:`graft.core.trace.trace_batch`): ``inputs`` (the
            forward's keyword arguments: ``input_ids``, ``attention_mask``,
            ``position_ids``), ``patches`` (the grafted modules' masks), ``pick`` (each
            row's last index).
        donor_modules: ``"donor:path"`` -> the donor module the graft calls there (or, for
            a hosted graft pair, its envoy path).
        spans: per row, each named span's positions in the padded batch (``LT`` included).
        stopped: whether the block called :meth:`stop`.
    """

    # No zero-argument super() here: a class sent by value is rebuilt from its source,
    # where the ``__class__`` cell that super() needs does not exist.

    def __init__(
        self,
        model: Any,
        batch: types.SimpleNamespace,
        donor_modules: DonorModules,
        spans: list[dict[str, list[int]]],
        backend: Any = None,
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
        InterleavingTracer.__init__(self, model, fn, backend=backend, **batch.inputs)
        self.batch = batch
        self.donor_modules = donor_modules
        self.spans = spans
        self.stopped = False

    @property
    def model(self) -> Any:
        """The base's nnsight envoy (the same paths as ``model.trace``); None after the block."""
        return self.envoy

    @property
    def inputs(self) -> dict[str, torch.Tensor]:
        """The batch as keyword arguments of the model's forward (a plain trace of the base
        on them, ``model.trace(**g.inputs)``, is this trace without the graft)."""
        return dict(self.batch.inputs)

    @property
    def logits(self) -> Any:
        """Inside the block: each row's logits at its last position [rows, vocab], as
        ``graft_texts`` returns them (read it after every module the block reads)."""
        return last_logits(self.envoy.output.logits, self.batch)

    def __exit__(self, *exc: Any) -> bool:
        """Run the block; then, like nnsight's tracer, hold no model weights (the donors')."""
        try:
            return InterleavingTracer.__exit__(self, *exc)
        finally:
            self.donor_modules = {}

    def stop(self) -> None:
        """Halt the model run here (nnsight's ``tracer.stop()``); the graft stops with it."""
        self.stopped = True
        InterleavingTracer.stop(self)

    def execute(self, code: Any) -> None:
        """Register the graft's block ahead of the user's, then run the trace (no gradients)."""
        graft = Mediator(
            compile(_GRAFT_SOURCE, "<graft>", "exec"),
            {"graft_trace_body": graft_trace_body},
            {
                "model": self.envoy,
                "patches": self.batch.patches,
                "donor_modules": self.donor_modules,
                "trace": self,
            },
        )
        self.envoy.interleaver.mediators.append(graft)  # the user's block comes after it
        with torch.no_grad():
            InterleavingTracer.execute(self, code)


def trace(
    base: Any,
    donors: Any,
    tokenizer: Any,
    texts: Sequence[str] | str,
    specs: Sequence[GraftSpec | str] | GraftSpec | str,
    *,
    fields: Sequence[Mapping[str, str]] | Mapping[str, str] | None = None,
    pad_id: int | None = None,
    executor: Any = None,
) -> GraftedTrace:
    """The graft as an nnsight trace: ``with graft.trace(...) as g:``.

    Inside the block, ``g.model`` is the base's nnsight envoy in a trace where the graft is
    applied; every module path, ``.input``, ``.output``, ``.save()`` and assignment works as
    in a plain ``model.trace``. A read of a grafted module's output sees the grafted value;
    a write to it lands after the graft. ``g.logits`` is each row's last-position logits.

    Args:
        base, donors, tokenizer, fields: as for :func:`graft.core.texts.graft_texts`.
        texts: a prompt, or a list of prompts: the rows of the batch, in order.
        specs: one spec for every text, or a list of one spec per text.
        pad_id: id used for padding (default: the tokenizer's pad id, else the config's).
        executor: where the trace runs: None or a ``LocalExecutor`` (this machine; its
            shortcuts do not apply), or a ``graft.remote.executor.RemoteExecutor`` (an
            NDIF server, or its simulation).

    Returns:
        the :class:`GraftedTrace`, to be entered with ``with``.
    """
    tokenizer = _tokenizer(base, tokenizer)
    text_list = _text_list(texts)
    spec_list = _spec_list(specs)
    if len(spec_list) == 1 and isinstance(specs, str | GraftSpec):
        spec_list = spec_list * len(text_list)
    if len(spec_list) != len(text_list):
        raise SpecError(
            f"specs: one spec for every text, or a list of one spec per text ({len(text_list)}), "
            f"not {len(spec_list)}"
        )
    field_list = _field_list(fields, text_list)
    rows = [
        _rows(tokenizer, [text], [spec], [named])[0]
        for text, spec, named in zip(text_list, spec_list, field_list, strict=True)
    ]
    if pad_id is None:
        pad_id = getattr(tokenizer, "pad_token_id", None)
    return trace_rows(base, donors, rows, pad_id=pad_id, executor=executor)


def trace_rows(
    base: Any,
    donors: Any,
    rows: Sequence[GraftRow],
    *,
    pad_id: int | None = None,
    executor: Any = None,
) -> GraftedTrace:
    """:func:`trace` on ``GraftRow``s (token ids, token spans, spec), one batch in order."""
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
    executor = LocalExecutor() if executor is None else executor
    parts = getattr(executor, "trace_parts", None)
    if parts is None:
        raise SpecError(
            f"executor {type(executor).__name__} cannot run a trace; use a LocalExecutor or a "
            "RemoteExecutor"
        )
    setup = parts(base, donors, plan.patches)
    batch = trace_batch(plan, torch_base, setup.device)
    spans = _padded_spans(rows, plan.last_index)
    return GraftedTrace(setup.model, batch, setup.donor_modules, spans, backend=setup.backend)


def _padded_spans(rows: Sequence[GraftRow], last_index: torch.Tensor) -> list[dict[str, list[int]]]:
    """Each row's named spans, and ``LT``, as positions in the left-padded batch."""
    out = []
    for row, last in zip(rows, last_index.tolist(), strict=True):
        offset = last - (len(row.input_ids) - 1)
        spans = {name: [p + offset for p in pos] for name, pos in row.spans.items()}
        spans["LT"] = [last]
        out.append(spans)
    return out
