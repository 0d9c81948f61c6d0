"""Per-prompt values kept across batches (graft.core.execution.prompt_values)."""

from __future__ import annotations

import torch

from graft.core.execution.prompt_values import PromptValues


def test_each_prompts_values_are_computed_once_and_the_oldest_go_first():
    asked: list = []

    def compute(part, tags):
        asked.append((part["input_ids"][:, 0].tolist(), list(tags)))
        return [part["input_ids"].float() * (1 + i) for i, _ in enumerate(tags)]

    def prompts(*firsts):
        ids = torch.tensor([[f, 7] for f in firsts])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": ids * 0}

    kept = PromptValues(most_bytes=3 * 2 * 4)  # three values of two floats
    a, b = kept.get(["a", "b"], prompts(1, 2), compute)
    assert a.tolist() == [[1, 7], [2, 7]] and b.tolist() == [[2, 14], [4, 14]]
    (a,) = kept.get(["a"], prompts(2, 3), compute)  # prompt 2 is kept: only 3 is computed
    assert a.tolist() == [[2, 7], [3, 7]]
    assert asked == [([1, 2], ["a", "b"]), ([3], ["a"])]
    kept.get(["a"], prompts(1), compute)  # beyond three values the least recently used went
    assert asked[-1] == ([1], ["a"])
