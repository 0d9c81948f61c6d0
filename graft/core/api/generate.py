"""``graft.generate``: what the grafted model writes, token by token, for a batch of prompts.

Semantics of a graft on a growing text: at every step the spec is resolved on the prompt
plus the tokens generated so far, as if that were the prompt. Named spans (FE, M, ...) stay
where they are in the prompt; ``LT`` and ``-1`` are the newest token (the one whose next
token is chosen); ``ALL`` and complements such as ``(FE+LT)^C`` take in the generated tokens.
So a token that was ``LT`` at one step is an ordinary position at the next: the text at
every step is grafted exactly as :func:`graft.graft_texts` would graft it. Grafting nothing
is the base's own greedy generation; ``ALL:all:all; head=donor`` is the donor's.

By default the steps run on a key/value cache, recomputing at each step only the positions
whose graft changed (:mod:`graft.core.api.decoding`: the newest token for a graft confined
to the prompt or for ``ALL``, the last two for ``LT``): the same tokens as recomputing the
whole text at every step (``cache=False``), which a remote executor or a model without a
cache argument falls back to, with a warning and the reason in :attr:`Generation.fallback`.

Sampling draws each (prompt, graft) row's tokens with a generator of its own, seeded from
``seed``, the prompt's tokens and spans and the graft, so a sampled text does not depend on
the other prompts and grafts of the call.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from graft.core.api.decoding import CachedSteps, RecomputeSteps, cache_refusal, steps_for
from graft.core.api.texts import Prompts, _prompt_list, _rows, _spec_list, _tokenizer, is_one_prompt
from graft.core.execution.engine import checked_inputs
from graft.core.execution.executor import Executor
from graft.core.execution.inputs import model_of
from graft.core.families.arch import context_length
from graft.core.families.wrapping import unwrap
from graft.core.language.graft_object import Graft
from graft.core.language.spec import GraftSpec
from graft.core.planning.plan import GraftRow
from graft.errors import SlowPathWarning, SpecError


@dataclass
class Generation:
    """What :func:`generate` wrote for each spec on one prompt.

    Args:
        specs: the grafts, in the order given.
        prompt_ids: the prompt's token ids.
        new_ids: per spec, the generated token ids (shorter where an end token stopped it).
        texts: per spec, the generated continuation decoded (without the prompt).
        cached: whether the steps ran on a key/value cache (else each recomputed the text).
        fallback: why the steps recomputed the whole text although a cache was asked for
            (also warned); None where the cache ran or ``cache=False`` was asked.
        positions_run: per spec, the token positions its batch ran for it, prompt included
            (with a cache: the prompt once, then each step's recomputed window).
    """

    specs: list[GraftSpec]
    prompt_ids: list[int]
    new_ids: list[list[int]]
    texts: list[str]
    cached: bool = False
    fallback: str | None = None
    positions_run: list[int] = field(default_factory=list)


def generate(
    base: Any,
    donors: Any,
    tokenizer: Any,
    text: Prompts,
    specs: Sequence[GraftSpec | Graft | str] | GraftSpec | Graft | str,
    *,
    fields: Sequence[Mapping[str, Any]] | Mapping[str, Any] | None = None,
    max_new_tokens: int = 16,
    sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    stop_at_eos: bool = True,
    cache: bool = True,
    batch_size: int = 32,
    executor: Executor | None = None,
) -> Generation | list[Generation]:
    """Continue each prompt of ``text`` under each graft of ``specs`` (see the module
    docstring for which positions a graft covers as the text grows).

    Args:
        base, donors, tokenizer: as for :func:`graft.core.api.texts.graft_texts`.
        text: a prompt (a string, or its token ids as a list of ints or a 1-D tensor), or a
            list of prompts of any lengths (or a 2-D tensor of ids, one prompt per row).
        specs: one graft (a spec text, a ``graft.Graft`` or a ``GraftSpec``) or a list.
        fields: per prompt, span name -> substring (or token positions), as for
            ``graft_texts``: one dict per prompt (a single dict with a single prompt).
        max_new_tokens: most tokens generated per (prompt, spec).
        sample: draw each token from the softmax of the logits divided by ``temperature``,
            after ``top_k`` and ``top_p``; False: the most probable token (greedy).
        temperature: the sampling temperature (> 0).
        top_k: sample among the ``top_k`` most probable tokens only (0: all of them).
        top_p: sample among the most probable tokens whose probabilities sum to ``top_p``
            (nucleus sampling; 1.0: all of them).
        seed: the sampling seed; each (prompt, spec) row draws with a generator of its own
            seeded from it, so the same seed draws the same text whatever else is in the call.
        stop_at_eos: stop a row's text at the tokenizer's end token (kept in ``new_ids``).
        cache: run the steps on a key/value cache, recomputing only the positions whose
            graft changed (the same tokens as without); False: recompute the whole text.
        batch_size: (prompt, spec) rows generated together, one cache per batch.
        executor: where the steps run (default: this machine; a remote executor recomputes).

    Returns:
        a :class:`Generation` for a single prompt; a list of them, one per prompt, for a
        list of prompts.
    """
    _check_options(max_new_tokens, sample, temperature, top_k, top_p, batch_size)
    tokenizer = _tokenizer(base, tokenizer)
    prompts, spec_list = _prompt_list(text), _spec_list(specs)
    rows = _rows(tokenizer, prompts, spec_list, fields)
    _check_room(base, rows, max_new_tokens)
    pad_id = getattr(tokenizer, "pad_token_id", None)
    checked_inputs(base, donors, rows, pad_id)  # every row's graft, before any batch runs
    fallback = cache_refusal(executor, base) if cache else None
    if fallback is not None:
        warnings.warn(f"graft.generate: {fallback}", SlowPathWarning, stacklevel=2)
    cached = cache and fallback is None
    eos = getattr(tokenizer, "eos_token_id", None) if stop_at_eos else None
    choose = _chooser(sample, temperature, top_k, top_p)
    new_ids: list[list[int]] = [[] for _ in rows]
    run = [0] * len(rows)
    # a batch steps as far back as its furthest-reaching graft needs: one graft per batch
    # where it can, prompts of similar lengths together
    order = sorted(range(len(rows)), key=lambda i: (str(rows[i].spec), len(rows[i].input_ids)))
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        gens = [_row_generator(seed, rows[i]) if sample else None for i in idx]
        steps = steps_for(
            base,
            donors,
            [rows[i] for i in idx],
            cached=cached,
            pad_id=pad_id,
            executor=executor,
        )
        with steps.session():
            _run_batch(steps, choose, gens, max_new_tokens, eos, new_ids, run, idx)
    out = []
    for p in range(len(prompts)):
        mine = range(p * len(spec_list), (p + 1) * len(spec_list))
        out.append(
            Generation(
                spec_list,
                list(rows[mine[0]].input_ids),
                [new_ids[i] for i in mine],
                [tokenizer.decode(new_ids[i], skip_special_tokens=False) for i in mine],
                cached=cached,
                fallback=fallback,
                positions_run=[run[i] for i in mine],
            )
        )
    return out[0] if is_one_prompt(text) else out


def _run_batch(
    steps: CachedSteps | RecomputeSteps,
    choose: Callable[[torch.Tensor, list], list[int]],
    gens: list[torch.Generator | None],
    max_new_tokens: int,
    eos: int | None,
    new_ids: list[list[int]],
    run: list[int],
    idx: list[int],
) -> None:
    """Generate the rows ``idx`` (``gens``: their generators) into ``new_ids``, and into
    ``run`` the positions their batch ran for each when it stopped."""
    live = list(range(len(idx)))  # positions in idx of the rows still going
    for step in range(max_new_tokens):
        tokens = choose(steps.logits(), [gens[j] for j in live])
        for j, token in zip(live, tokens, strict=True):
            new_ids[idx[j]].append(token)
        going = [k for k, token in enumerate(tokens) if token != eos]
        for k in sorted(set(range(len(live))) - set(going)):
            run[idx[live[k]]] = steps.positions_run
        live = [live[k] for k in going]
        if not live or step == max_new_tokens - 1:
            break
        if len(going) < len(tokens):
            steps.keep(going)
        steps.extend([tokens[k] for k in going])
    for j in live:
        run[idx[j]] = steps.positions_run


def _check_options(
    max_new_tokens: int, sample: bool, temperature: float, top_k: int, top_p: float, batch: int
) -> None:
    if max_new_tokens < 1:
        raise SpecError(f"max_new_tokens must be >= 1, not {max_new_tokens}")
    if batch < 1:
        raise SpecError(f"batch_size must be >= 1, not {batch}")
    if sample and not temperature > 0:
        raise SpecError(f"temperature must be > 0 for sampling, not {temperature}")
    if not (isinstance(top_k, int) and top_k >= 0):
        raise SpecError(f"top_k must be an integer >= 0 (0: no limit), not {top_k!r}")
    if not 0 < top_p <= 1:
        raise SpecError(f"top_p must be in (0, 1] (1: no limit), not {top_p!r}")
    if not sample and (top_k or top_p < 1):
        raise SpecError("top_k and top_p shape sampling; pass sample=True or leave them out")


def _check_room(base: Any, rows: Sequence[GraftRow], max_new_tokens: int) -> None:
    """Refuse rows whose text would outgrow the model's positions before the last step."""
    limit = context_length(unwrap(model_of(base)))
    longest = max(len(row.input_ids) for row in rows)
    if limit is not None and longest + max_new_tokens - 1 > limit:
        raise SpecError(
            f"a prompt of {longest} tokens and max_new_tokens={max_new_tokens} need "
            f"{longest + max_new_tokens - 1} positions but the model has only {limit}; "
            "shorten the prompt or lower max_new_tokens"
        )


def _row_generator(seed: int, row: GraftRow) -> torch.Generator:
    """A generator seeded from ``seed`` and the row itself (prompt ids, spans, graft)."""
    spans = sorted((name, tuple(pos)) for name, pos in row.spans.items())
    key = repr((seed, tuple(row.input_ids), spans, str(row.spec)))
    digest = hashlib.sha256(key.encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def _chooser(sample: bool, temperature: float, top_k: int, top_p: float):
    """``choose(logits [rows, vocab], generators) -> one token id per row``: greedy, or
    sampled after transformers' temperature, top-k and top-p warpers, each row with its own
    generator."""
    if not sample:
        return lambda logits, gens: [int(i) for i in logits.argmax(-1)]
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    warpers = LogitsProcessorList()
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if top_k:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))

    def choose(logits: torch.Tensor, gens: Sequence[torch.Generator | None]) -> list[int]:
        no_ids = cast(torch.LongTensor, torch.empty((len(logits), 0), dtype=torch.long))
        scores = warpers(no_ids, cast(torch.FloatTensor, logits.double()))
        probs = torch.softmax(scores, dim=-1)
        return [int(torch.multinomial(p, 1, generator=g)) for p, g in zip(probs, gens, strict=True)]

    return choose
