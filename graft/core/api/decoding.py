"""The steps of :func:`graft.generate`: next-token logits of a batch of growing texts, each
under its own graft, on a key/value cache where that is exact (:class:`CachedSteps`) or by
recomputing every text at every step (:class:`RecomputeSteps`).

At every step a row's graft is resolved on its text so far (:mod:`graft.core.api.generate`),
and the recompute path runs that whole text grafted so. By causality the keys and values of
a position depend only on what is grafted at it and before it, so a cache's entries for
positions ``0..p`` are the recompute path's as long as what is grafted at those positions is
what it was when they were computed. :class:`CachedSteps` keeps, per row and cached
position, what was grafted there (its *signature*: the ``(layer, component, donor)`` cells),
finds at every step the first position whose signature changed, drops the cache from there
(from the batch's earliest such column) and runs only the columns from there to the newest
token, grafted as the text is now grafted:

- a graft confined to the prompt's positions (FE, M, R, numbered positions) never changes a
  computed position: after the prompt every step runs the newest token alone, ungrafted, as
  the model's own forward on the cache;
- ``ALL`` grafts every position as it comes, so it too runs one token a step (grafted);
- ``LT`` (the newest token) moves: the token that was ``LT`` is an ordinary position at the
  next step, so a step runs two tokens, the previous one ungrafted and the newest grafted;
  ``(FE+LT)^C`` likewise with the roles swapped;
- whatever else a spec resolves to, the same rule recomputes exactly what changed (at worst
  the whole text: the recompute path's work).

The head (final norm and unembedding) reads the last position only and leaves the cache
alone. The cache is a plain :class:`transformers.DynamicCache` (every layer keeps every
position; sliding-window layers mask by position), so it can be cut at any column.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch

from graft.core.execution.engine import checked_inputs, run_grafts
from graft.core.execution.executor import Executor, LocalExecutor
from graft.core.language.spec import ResolvedGraft
from graft.core.planning.kv_cache import cache_argument
from graft.core.planning.plan import GraftRow, LayoutCache, plan_batch, resolve_rows
from graft.core.planning.prefix import columns_from

#: What is grafted at one position: sorted ``((layer, component), donor)`` pairs.
Signature = tuple[tuple[tuple[int, str], str], ...]


def signatures(res: ResolvedGraft, length: int) -> list[Signature]:
    """What ``res`` (resolved on ``length`` tokens) grafts at each position, as comparable
    tuples: equal at a position and every one before it, the position computes the same keys
    and values (causality)."""
    at: list[list[tuple[tuple[int, str], str]]] = [[] for _ in range(length)]
    for key, cell in res.cells.items():
        for position, donor in cell.items():
            at[position].append((key, donor))
    return [tuple(sorted(cells)) for cells in at]


def first_change(before: Sequence[Signature], now: Sequence[Signature]) -> int:
    """The first position where ``now`` differs from ``before`` (the signatures the cached
    positions were computed with); ``len(before)`` where none does."""
    for position, (old, new) in enumerate(zip(before, now, strict=False)):
        if old != new:
            return position
    return len(before)


def cache_refusal(executor: Executor | None, base: Any) -> str | None:
    """Why a key/value cache cannot serve :func:`graft.generate` here, or None where it can."""
    from graft.core.execution.inputs import model_of
    from graft.core.families.wrapping import unwrap

    if executor is not None and not isinstance(executor, LocalExecutor):
        return (
            f"the key/value cache runs on this machine only, not with {type(executor).__name__}: "
            "every step recomputes the whole text there"
        )
    torch_base = unwrap(model_of(base))
    if cache_argument(torch_base) is None:
        return (
            f"{type(torch_base).__name__}'s forward takes no key/value cache argument graft "
            "knows: every step recomputes the whole text"
        )
    return None


class _GrowingRows:
    """A batch's rows and their texts so far, which every step grows by one token a row."""

    def __init__(self, rows: Sequence[GraftRow]) -> None:
        self.rows = list(rows)
        self.ids = [list(row.input_ids) for row in rows]
        #: columns run so far (each row runs every column of its batch's windows)
        self.positions_run = 0

    def step_rows(self) -> list[GraftRow]:
        """The rows with their texts so far."""
        return [GraftRow(ids, r.spans, r.spec) for ids, r in zip(self.ids, self.rows, strict=True)]

    def extend(self, tokens: Sequence[int]) -> None:
        """Append one token to each row's text."""
        for ids, token in zip(self.ids, tokens, strict=True):
            ids.append(int(token))

    def keep(self, index: Sequence[int]) -> None:
        """Keep only the rows ``index`` (the others stopped)."""
        self.rows = [self.rows[i] for i in index]
        self.ids = [self.ids[i] for i in index]


class CachedSteps(_GrowingRows):
    """Next-token logits of one batch of rows, step after step, on one key/value cache.

    Call :meth:`logits` for the rows' next-token logits, then :meth:`extend` with one new
    token per row, and again. Rows are left-padded to the longest prompt once; every row
    grows by one token a step, so the padding (and each row's columns) never moves.
    """

    def __init__(
        self,
        base: Any,
        donors: Any,
        rows: Sequence[GraftRow],
        *,
        pad_id: int | None,
        executor: LocalExecutor | None = None,
    ) -> None:
        checked = checked_inputs(base, donors, rows, pad_id)
        self.base, self.donors, self.arch, self.same, self.pad_id, _ = checked
        self.executor = executor or LocalExecutor()
        super().__init__(rows)
        self.before: list[list[Signature]] = [[] for _ in rows]
        self.cached = 0  # columns the cache holds
        self.width = max(len(ids) for ids in self.ids)  # the padded texts' columns
        self.layouts = LayoutCache()
        from transformers import DynamicCache

        self.cache = DynamicCache()  # full layers: any column can be cut (module docstring)

    def logits(self) -> torch.Tensor:
        """Each row's next-token logits [rows, vocab] (float32, float64 for such a model)."""
        rows = self.step_rows()
        resolved = resolve_rows(self.arch, rows, self.donors)
        width = self.width
        start, now, memo = self.cached, [], {}
        for ids, res, before in zip(self.ids, resolved, self.before, strict=True):
            if id(res) not in memo:  # rows of one spec, spans and length resolve alike
                memo[id(res)] = signatures(res, len(ids))
            now.append(memo[id(res)])
            start = min(start, width - len(ids) + first_change(before, now[-1]))
        if start < self.cached:
            self.cache.crop(start - self.cached)  # negative: columns dropped from the end
        full = plan_batch(
            self.arch, rows, pad_id=self.pad_id, resolved=resolved, layouts=self.layouts
        )
        full.patches = [p for p in full.patches if p.donor not in self.same]
        window = columns_from(full, start)
        out = self.executor.run_on_cache(self.base, self.donors, window, self.cache)
        self.cached, self.before = width, now
        self.positions_run += width - start
        return out.double() if out.dtype == torch.float64 else out.float()

    def session(self) -> contextlib.AbstractContextManager:
        """The block the steps run in (the models' module trees walked once in it)."""
        return self.executor.walking_once()

    def extend(self, tokens: Sequence[int]) -> None:
        """Append one token to each row's text (the padded width grows by one)."""
        super().extend(tokens)
        self.width += 1

    def keep(self, index: Sequence[int]) -> None:
        """Keep only the rows ``index`` (the others stopped), their cache rows with them; the
        columns that were padding for every kept row leave the cache."""
        super().keep(index)
        self.before = [self.before[i] for i in index]
        self.cache.batch_select_indices(torch.tensor(list(index), dtype=torch.long))
        width = max(len(ids) for ids in self.ids)
        padding, self.width = self.width - width, width
        if padding > 0:
            layer: Any
            for layer in self.cache.layers:  # plain key/value layers (module docstring)
                if isinstance(getattr(layer, "keys", None), torch.Tensor):
                    layer.keys = layer.keys[..., padding:, :]
                    layer.values = layer.values[..., padding:, :]
            self.cached -= padding


class RecomputeSteps(_GrowingRows):
    """Next-token logits of one batch of rows, step after step, each step recomputing every
    whole text through :func:`graft.core.execution.engine.run_grafts` (any executor)."""

    def __init__(
        self,
        base: Any,
        donors: Any,
        rows: Sequence[GraftRow],
        *,
        pad_id: int | None,
        executor: Executor | None = None,
    ) -> None:
        self.base, self.donors, self.executor, self.pad_id = base, donors, executor, pad_id
        super().__init__(rows)

    def logits(self) -> torch.Tensor:
        """As :meth:`CachedSteps.logits`."""
        step = self.step_rows()
        self.positions_run += max(len(ids) for ids in self.ids)
        return run_grafts(
            self.base,
            self.donors,
            step,
            executor=self.executor,
            batch_size=len(step),
            pad_id=self.pad_id,
        )

    def session(self) -> contextlib.AbstractContextManager:
        """As :meth:`CachedSteps.session`."""
        return contextlib.nullcontext()


def steps_for(
    base: Any,
    donors: Any,
    rows: Sequence[GraftRow],
    *,
    cached: bool,
    pad_id: int | None,
    executor: Executor | None,
) -> CachedSteps | RecomputeSteps:
    """The steps of ``rows``: on a cache (``cached``; a local executor) or recomputed."""
    if cached:
        assert executor is None or isinstance(executor, LocalExecutor)  # cache_refusal said so
        return CachedSteps(base, donors, rows, pad_id=pad_id, executor=executor)
    return RecomputeSteps(base, donors, rows, pad_id=pad_id, executor=executor)


__all__ = [
    "CachedSteps",
    "RecomputeSteps",
    "Signature",
    "cache_refusal",
    "first_change",
    "signatures",
    "steps_for",
]
