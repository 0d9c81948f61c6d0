"""The logits of grafted batches computed by the engine from the head's inputs, into one
buffer per head, kept across calls.

On the CPU a batch's last-position logits are ``rows x vocabulary`` floats (64 MB for 128
rows of Llama-3.2's 128,256 tokens) that the engine only copies into its result; made by
the model's forward they are a fresh allocation each batch, whose page faults cost about
as much as the copy. Where the model's logits are exactly its head's output (a linear
layer; no soft-capping or scaling after it), a grafted batch hands over each row's *input*
to the head instead (:func:`head_inputs`, a few hundred floats a row) and the engine
computes the same product, with the same rows, into a buffer kept with the head across
calls (:class:`HeadProducts`; :func:`release_buffers` frees them): the same numbers bit for
bit.

Batches that graft nothing keep the model's own forward, and so do batches that graft the
head itself, runs with targets (metrics), runs on a GPU and reduced-precision heads.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from graft.errors import SlowPathWarning

#: config attributes of transformers models that change the logits after the head's product
_AFTER_HEAD = ("final_logit_softcapping", "logit_scale", "logits_scaling")
#: model classes whose forward was seen to change the head's output (warned once each)
_changed: set[str] = set()
_ABSENT = object()


@dataclass
class DeferredLogits:
    """A batch's rows' input to the head at their last position; the logits are
    ``head(hidden)``.

    Args:
        hidden: [rows, hidden size], on the CPU.
        head: the model's output embedding (an ``nn.Linear``) that computes them.
    """

    hidden: torch.Tensor
    head: nn.Linear


class HeadOutputChanged(RuntimeError):
    """The model's forward changed its head's output: its logits are not ``head(hidden)``."""


def deferrable_head(torch_model: nn.Module) -> nn.Linear | None:
    """``torch_model``'s head when its logits can be computed after the batches: a linear
    output embedding on the CPU in float32 or float64, with no soft-capping or scaling of
    the logits after it in the config, and a forward not seen to change the head's output;
    else None."""
    get = getattr(torch_model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if not isinstance(head, nn.Linear):
        return None
    if head.weight.device.type != "cpu" or head.weight.dtype not in (torch.float32, torch.float64):
        return None
    config = getattr(torch_model, "config", None)
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in _AFTER_HEAD):
        return None
    if type(torch_model).__qualname__ in _changed:
        return None
    return head


def note_head_changed(torch_model: nn.Module) -> None:
    """Record (and warn once) that ``torch_model``'s class changes its head's output, so its
    logits are computed per batch from now on."""
    name = type(torch_model).__qualname__
    if name not in _changed:
        _changed.add(name)
        warnings.warn(
            f"graft: {name}'s forward changes its head's output, so its grafted batches' "
            "logits come from its own forward: the same numbers, a fresh logits tensor per "
            "batch (slower on the CPU)",
            SlowPathWarning,
            stacklevel=3,
        )


@contextlib.contextmanager
def head_inputs(head: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Within the block, ``head``'s forward returns its input unchanged and records it in the
    list the block gets (the model's logits are then that input, if the model does not change
    its head's output: the caller checks that with :func:`check_unchanged`)."""
    seen: list[torch.Tensor] = []
    before = head.__dict__.get("forward", _ABSENT)

    def forward(x: torch.Tensor) -> torch.Tensor:
        seen.append(x)
        return x

    head.forward = forward  # set on the instance for the block
    try:
        yield seen
    finally:
        if before is _ABSENT:
            del head.__dict__["forward"]
        else:
            head.__dict__["forward"] = before


def check_unchanged(logits: torch.Tensor, seen: Sequence[torch.Tensor]) -> None:
    """Raise :class:`HeadOutputChanged` unless the model returned as its logits the very
    tensor its head's forward returned (in :func:`head_inputs`)."""
    if len(seen) != 1 or logits is not seen[0]:
        raise HeadOutputChanged


#: the largest buffer kept for a head between calls (64 MiB: 128 rows of Llama-3.2's
#: 128,256-token vocabulary fit, Gemma 3's 262,144 do not); a larger one is allocated per call
KEEP_MAX_BYTES = 64 << 20
#: per head module, the buffer its deferred logits were last computed into, kept across
#: :func:`graft.core.execution.engine.run_grafts` calls (freed with the model, or by
#: :func:`release_buffers`), and the lock that gives it to one call at a time
_kept: weakref.WeakKeyDictionary[nn.Module, torch.Tensor] = weakref.WeakKeyDictionary()
_locks: weakref.WeakKeyDictionary[nn.Module, threading.Lock] = weakref.WeakKeyDictionary()
_locks_lock = threading.Lock()


def release_buffers() -> None:
    """Free the buffers kept for every head (``rows x vocabulary`` floats each: 64 MB for a
    128-row batch of Llama-3.2's 128,256 tokens); the next call allocates afresh."""
    _kept.clear()


def _fits(buffer: torch.Tensor, rows: int, vocab: int, dtype: torch.dtype) -> bool:
    """Whether ``buffer`` can hold ``rows`` rows of ``vocab`` logits in ``dtype``."""
    return buffer.dtype == dtype and buffer.shape[1] == vocab and buffer.shape[0] >= rows


def _lock_of(head: nn.Module) -> threading.Lock:
    with _locks_lock:
        lock = _locks.get(head)
        if lock is None:
            lock = _locks[head] = threading.Lock()
        return lock


class HeadProducts:
    """Computes :class:`DeferredLogits` into one buffer per head, so that a batch's logits
    cost the head's product and one copy into the result, not a fresh allocation each.

    The buffer is kept across calls with the head (grown when a batch has more rows, up to
    :data:`KEEP_MAX_BYTES`; a larger one is allocated per call): a fresh one costs its page
    faults every call (about 30 ms of a Llama-vocabulary E3 call on the CPU). One user at a
    time: while another call (a thread) holds a head's buffer, this one uses a buffer of its
    own. A result is valid until the next call; :meth:`close` gives the kept buffers back."""

    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None
        self._head: nn.Module | None = None
        self._held: list[threading.Lock] = []

    def _buffer_for(
        self, head: nn.Module, rows: int, vocab: int, dtype: torch.dtype
    ) -> torch.Tensor:
        if rows * vocab * dtype.itemsize > KEEP_MAX_BYTES:  # too much to hold while idle
            return torch.empty((rows, vocab), dtype=dtype)
        lock = _lock_of(head)
        if lock not in self._held and lock.acquire(blocking=False):
            self._held.append(lock)
        if lock not in self._held:  # another call holds this head's buffer
            return torch.empty((rows, vocab), dtype=dtype)
        kept = _kept.get(head)
        if kept is None or not _fits(kept, rows, vocab, dtype):
            _kept.pop(head, None)  # the old one freed before the new one is allocated
            kept = _kept[head] = torch.empty((rows, vocab), dtype=dtype)
        return kept

    def __call__(self, deferred: DeferredLogits) -> torch.Tensor:
        """``deferred``'s logits [rows, vocab]: the head's product on the rows' inputs, the
        same product with the same rows as the model's forward computes."""
        weight, bias = deferred.head.weight, deferred.head.bias
        rows, vocab = deferred.hidden.shape[0], weight.shape[0]
        buffer = self._buffer
        if (
            buffer is None
            or self._head is not deferred.head
            or not _fits(buffer, rows, vocab, weight.dtype)
        ):
            buffer = self._buffer = None  # a kept buffer being grown is freed before its successor
            buffer = self._buffer = self._buffer_for(deferred.head, rows, vocab, weight.dtype)
            self._head = deferred.head
        out = buffer[:rows]
        with torch.no_grad():
            if bias is None:
                torch.mm(deferred.hidden, weight.t(), out=out)
            else:
                torch.addmm(bias, deferred.hidden, weight.t(), out=out)
        return out

    def close(self) -> None:
        """Give back the kept buffers this object held (the results it returned are then
        no longer valid)."""
        self._buffer = self._head = None
        while self._held:
            self._held.pop().release()
