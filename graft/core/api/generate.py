"""``graft.generate``: what the grafted model writes, token by token.

Semantics of a graft on a growing text: at every step the spec is resolved on the prompt
plus the tokens generated so far, as if that were the prompt. Named spans (FE, M, ...) stay
where they are in the prompt; ``LT`` and ``-1`` are the newest token (the one whose next
token is chosen); ``ALL`` and complements such as ``(FE+LT)^C`` take in the generated tokens.
Each step recomputes the whole text (no key/value cache across steps), so a token that was
``LT`` at one step is an ordinary position at the next: the text at every step is grafted
exactly as :func:`graft.graft_texts` would graft it. Grafting nothing is the base's own
greedy generation; ``ALL:all:all; head=donor`` is the donor's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from graft.core.api.texts import Prompt, _prompt_list, _rows, _spec_list, _tokenizer, is_one_prompt
from graft.core.execution.engine import run_grafts
from graft.core.execution.executor import Executor
from graft.core.language.graft_object import Graft
from graft.core.language.spec import GraftSpec
from graft.core.planning.plan import GraftRow
from graft.errors import SpecError


@dataclass
class Generation:
    """What :func:`generate` wrote for each spec.

    Args:
        specs: the grafts, in the order given.
        prompt_ids: the prompt's token ids.
        new_ids: per spec, the generated token ids (shorter where an end token stopped it).
        texts: per spec, the generated continuation decoded (without the prompt).
    """

    specs: list[GraftSpec]
    prompt_ids: list[int]
    new_ids: list[list[int]]
    texts: list[str]


def generate(
    base: Any,
    donors: Any,
    tokenizer: Any,
    text: Prompt,
    specs: Sequence[GraftSpec | Graft | str] | GraftSpec | Graft | str,
    *,
    fields: Mapping[str, Any] | None = None,
    max_new_tokens: int = 16,
    sample: bool = False,
    temperature: float = 1.0,
    seed: int = 0,
    stop_at_eos: bool = True,
    executor: Executor | None = None,
) -> Generation:
    """Continue ``text`` under each graft of ``specs`` (see the module docstring for which
    positions a graft covers as the text grows).

    Args:
        base, donors, tokenizer, fields: as for :func:`graft.core.api.texts.graft_texts`.
        text: the prompt: a string, or its token ids (a list of ints or a 1-D tensor).
        specs: one graft (a spec text, a ``graft.Graft`` or a ``GraftSpec``) or a list.
        max_new_tokens: most tokens generated per spec.
        sample: draw each token from the softmax of the logits divided by ``temperature``
            (with a generator seeded by ``seed``); False: the most probable token (greedy).
        temperature: the sampling temperature (> 0).
        seed: the sampling seed (the same seed draws the same text).
        stop_at_eos: stop a spec's text at the tokenizer's end token (kept in ``new_ids``).
        executor: where the steps run (default: this machine).

    Returns:
        a :class:`Generation`.
    """
    if not is_one_prompt(text):
        raise SpecError(
            "graft.generate continues one prompt: give text as a string or one prompt's token "
            "ids (a list of ints or a 1-D tensor)"
        )
    if max_new_tokens < 1:
        raise SpecError(f"max_new_tokens must be >= 1, not {max_new_tokens}")
    if sample and not temperature > 0:
        raise SpecError(f"temperature must be > 0 for sampling, not {temperature}")
    tokenizer = _tokenizer(base, tokenizer)
    spec_list = _spec_list(specs)
    rows = _rows(tokenizer, _prompt_list(text), spec_list, [dict(fields or {})])
    prompt = list(rows[0].input_ids)
    eos = getattr(tokenizer, "eos_token_id", None) if stop_at_eos else None
    generator = torch.Generator().manual_seed(seed)
    new_ids: list[list[int]] = [[] for _ in spec_list]
    live = list(range(len(spec_list)))
    for _ in range(max_new_tokens):
        step = [GraftRow(prompt + new_ids[i], rows[i].spans, rows[i].spec, None) for i in live]
        logits = run_grafts(base, donors, step, executor=executor, batch_size=len(step))
        for i, row_logits in zip(live, logits, strict=True):
            new_ids[i].append(_choose(row_logits, sample, temperature, generator))
        live = [i for i in live if eos is None or new_ids[i][-1] != eos]
        if not live:
            break
    texts = [tokenizer.decode(ids, skip_special_tokens=False) for ids in new_ids]
    return Generation(spec_list, prompt, new_ids, texts)


def _choose(logits: torch.Tensor, sample: bool, temperature: float, gen: torch.Generator) -> int:
    if not sample:
        return int(logits.argmax())
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=gen))
