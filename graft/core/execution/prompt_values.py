"""Values computed per prompt, kept across a run's batches: a sweep's prompt spans many
batches (they come prompt by prompt), and what the running model or a donor computes on the
prompt alone (its layer inputs, a donor's site outputs: :mod:`graft.core.execution.resume`)
is the same in each."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import torch

#: What a :class:`PromptValues` keeps at most (the least recently used go first), unless one
#: batch's own values need more: a sweep's prompt spans many batches, which come prompt by
#: prompt, so each prompt's values are computed once.
KEEP_BYTES = 256 * 2**20


class PromptValues:
    """Values computed per distinct padded prompt (its layer inputs, a donor's site outputs),
    kept across a run's batches up to ``most_bytes``, so that each prompt's are computed once.

    Args:
        most_bytes: the most bytes kept beyond one batch's own values.
    """

    def __init__(self, most_bytes: int = KEEP_BYTES) -> None:
        self.most_bytes = most_bytes
        self._kept: OrderedDict[tuple, torch.Tensor] = OrderedDict()
        self._bytes = 0

    def get(
        self,
        tags: Sequence[Hashable],
        distinct: Mapping[str, Any],
        compute: Callable[[dict[str, Any], list[Hashable]], list[torch.Tensor]],
    ) -> list[torch.Tensor]:
        """Per tag, its value on ``distinct``'s prompts [prompts, ...]: ``compute(part,
        tags)`` (one tensor [part's prompts, ...] per tag asked) runs once, for the prompts and
        tags not kept."""
        ids = distinct["input_ids"]
        key = torch.cat([ids, distinct["attention_mask"], distinct["position_ids"]], 1).cpu()
        prompts = [tuple(row.tolist()) for row in key]
        missing = [(t, i) for t in tags for i, p in enumerate(prompts) if (t, p) not in self._kept]
        if missing:
            ask = list(dict.fromkeys(t for t, _ in missing))
            rows = sorted({i for _, i in missing})
            index = torch.tensor(rows, device=ids.device)
            n = ids.shape[0]
            part = {
                k: v.index_select(0, index)
                if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == n
                else v
                for k, v in distinct.items()
            }
            for tag, value in zip(ask, compute(part, ask), strict=True):
                for j, i in enumerate(rows):
                    self._keep((tag, prompts[i]), value[j])
        wanted = [(t, p) for t in tags for p in prompts]
        for k in wanted:
            self._kept.move_to_end(k)
        floor = sum(self._kept[k].nbytes for k in wanted)
        while self._bytes > max(self.most_bytes, floor) and self._kept:
            _, dropped = self._kept.popitem(last=False)
            self._bytes -= dropped.nbytes
        return [torch.stack([self._kept[(t, p)] for p in prompts]) for t in tags]

    def _keep(self, key: tuple, value: torch.Tensor) -> None:
        old = self._kept.pop(key, None)
        if old is not None:
            self._bytes -= old.nbytes
        value = value.clone()  # not a view that would hold the whole batch's tensor
        self._kept[key] = value
        self._bytes += value.nbytes

    def clear(self) -> None:
        """Forget every prompt's values."""
        self._kept.clear()
        self._bytes = 0
