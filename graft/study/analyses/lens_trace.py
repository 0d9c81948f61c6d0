"""The logit lens inside a grafted trace: the residual stream at the last token (``LT``)
and at the first entity's last token (``FE-last``), at the embeddings and after every layer,
decoded through the graft's readout (its final norm and unembedding), scored on the row's
target token as the run scores its logits, with the top-k tokens of every readout.

:func:`logit_lens` does it for engine rows: one nnsight trace per batch
(:func:`graft.core.api.grafted_trace.trace_rows`, the engine's own trace code, so a grafted row's
layers are exactly the graft's), the input of the first layer (the embeddings, layer
:data:`~graft.results.plots.lens.EMBEDDING_LAYER` = -1, labelled ``emb``) and every layer's
output saved at the two positions only, the trace stopped after the last layer; each saved
state then goes through the readout, two positions per row and layer, never a vocabulary of
logits for every position. A reference that is a whole donor with its own head (``SFT``) is
that donor's own run (a trace of the donor, nothing grafted), as the engine routes it;
``none`` (``PRE``) is the base's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import nnsight
import torch
from torch import nn

from graft.core.api.grafted_trace import trace_rows
from graft.core.families.arch import architecture_of
from graft.core.families.wrapping import unwrap
from graft.core.language.spec import RESOLUTIONS, GraftSpec, parse_spec
from graft.core.planning.plan import GraftRow
from graft.errors import ExperimentError
from graft.study.specs.choices import DEFAULT_TOP_K

#: The positions the lens reads: the last token, and the last token of the first entity.
POSITIONS = ("LT", "FE-last")

_NOTHING = parse_spec("none")


@dataclass
class LensScores:
    """The lens of some rows. The layer axis has ``n_layers + 1`` entries: the embeddings
    (the stream before the first layer, :data:`EMBEDDING_LAYER`) first, then each layer's
    output, the last of which the model's own final logits read.

    Args:
        target_rank: ``[rows, layers + 1, positions]`` the target's rank (0 = top; the count
            of tokens with a strictly greater logit, as :func:`graft.results.metrics.
            example_metrics` counts it).
        target_logprob: ``[rows, layers + 1, positions]`` its log-probability (float32
            log-softmax).
        top_ids: ``[rows, layers + 1, positions, k]`` the k most probable tokens, most
            probable first.
        top_logprob: ``[rows, layers + 1, positions, k]`` their log-probabilities.
        has_position: ``[rows, positions]`` whether the row has the position (a prompt
            without an ``FE`` span has no ``FE-last``; its entries are 0 and not stored).
    """

    target_rank: torch.Tensor
    target_logprob: torch.Tensor
    top_ids: torch.Tensor
    top_logprob: torch.Tensor
    has_position: torch.Tensor


def own_model(spec: GraftSpec) -> str | None:
    """The donor a spec is whole, with its own head (``ALL:all:all@d; head=donor@d``, the
    ``SFT`` reference), else None: such a row is that donor's own run."""
    # under a protocol whose ``all`` leaves out the position embedding, it is not the donor
    if (
        len(spec.rules) != 1
        or spec.head != "donor"
        or not RESOLUTIONS[spec.protocol].all_has_pos_embed
    ):
        return None
    rule = spec.rules[0]
    whole = (rule.positions, rule.layers, tuple(rule.components)) == ("ALL", "all", ("all",))
    return rule.donor if whole and spec.head_donor == rule.donor else None


def logit_lens(
    base: nn.Module,
    donors: Mapping[str, nn.Module],
    rows: Sequence[GraftRow],
    targets: Sequence[int],
    *,
    pad_id: int | None = None,
    top_k: int = DEFAULT_TOP_K,
) -> LensScores:
    """The logit lens of ``rows`` (one batch): the embeddings and each layer's output at
    ``LT`` and ``FE-last`` decoded through the row's readout, scored on its target token,
    with the ``top_k`` most probable tokens of each readout.

    The readout is the graft's: the final norm and unembedding its head policy gives the last
    position (the base's, or a donor's with ``head=donor``), used at both positions; a whole
    donor with its own head runs as that donor and reads out with its own.

    Args:
        base: the base model (a Hugging Face causal LM).
        donors: donor name -> model, as the rows' specs name them.
        rows: the engine rows (token ids, token spans, spec).
        targets: each row's target token id.
        pad_id: the padding id (default: the base config's).
        top_k: how many top tokens to keep per (row, layer, position) (at most the
            vocabulary).
    """
    if len(targets) != len(rows):
        raise ExperimentError(f"{len(targets)} targets for {len(rows)} rows")
    if top_k < 1:
        raise ExperimentError(f"top_k must be at least 1, not {top_k}", param="top_k")
    n_layers = architecture_of(unwrap(base)).n_layers
    shape = (len(rows), n_layers + 1, len(POSITIONS))
    rank = torch.zeros(shape, dtype=torch.long)
    logprob = torch.zeros(shape, dtype=torch.float32)
    top_ids: torch.Tensor | None = None
    top_lp: torch.Tensor | None = None
    has = torch.tensor([[True, "FE" in r.spans and bool(r.spans["FE"])] for r in rows])
    runs: dict[str | None, list[int]] = {}
    for i, row in enumerate(rows):
        runs.setdefault(own_model(row.spec), []).append(i)
    for owner, idx in runs.items():
        if owner is None:
            model, its_donors, run_rows = base, donors, [rows[i] for i in idx]
        else:  # the donor's own run: nothing grafted, its own readout
            model, its_donors = donors[owner], {}
            run_rows = [replace(rows[i], spec=_NOTHING) for i in idx]
        states = _layer_states(model, its_donors, run_rows, pad_id)
        readouts: dict[tuple[str | None, str | None], list[int]] = {}
        for j, row in enumerate(run_rows):
            readouts.setdefault(_readout(model, row), []).append(j)
        for (norm_of, unembed_of), part in readouts.items():
            norm = _module(model, its_donors, norm_of, "final_norm_path")
            unembed = _module(model, its_donors, unembed_of, "unembed_path")
            ids = torch.tensor([targets[idx[j]] for j in part])
            r, lp, tid, tlp = _decode(states[part], norm, unembed, ids, _softcap(model), top_k)
            if top_ids is None or top_lp is None:
                top_ids = torch.zeros((*shape, tid.shape[-1]), dtype=torch.long)
                top_lp = torch.zeros((*shape, tid.shape[-1]), dtype=torch.float32)
            at = [idx[j] for j in part]
            rank[at], logprob[at], top_ids[at], top_lp[at] = r, lp, tid, tlp
    if top_ids is None or top_lp is None:  # no rows
        top_ids = torch.zeros((*shape, top_k), dtype=torch.long)
        top_lp = torch.zeros((*shape, top_k), dtype=torch.float32)
    return LensScores(rank, logprob, top_ids, top_lp, has)


def _layer_states(
    model: nn.Module, donors: Mapping[str, nn.Module], rows: list[GraftRow], pad_id: int | None
) -> torch.Tensor:
    """``[rows, layers + 1, positions, hidden]``: the first layer's input (the embeddings)
    and every layer's output at ``LT`` and ``FE-last`` in the grafted trace (a row without
    ``FE`` repeats ``LT``), the trace stopped after the last layer (no head over every
    position)."""
    arch = architecture_of(unwrap(model))
    paths = [f"{arch.table.layers_path}.{i}" for i in range(arch.n_layers)]
    g = trace_rows(model, donors, rows, pad_id=pad_id)
    pos = torch.tensor([[s["LT"][0], s.get("FE", s["LT"])[-1]] for s in g.spans])
    which = torch.arange(len(rows))[:, None]
    with g:
        # the first layer's input: the token (and position) embeddings, grafted ones included
        embedded = _at(g.model.get(paths[0]).input, which, pos)
        saved = nnsight.save([embedded] + [_at(g.model.get(p).output, which, pos) for p in paths])
        g.stop()  # the head would compute every position's logits
    return torch.stack(saved, dim=1)


def _at(output: Any, which: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """A decoder layer's hidden states (some families return a tuple) at ``[which, pos]``."""
    hidden = output[0] if isinstance(output, tuple) else output
    return hidden[which.to(hidden.device), pos.to(hidden.device)]


def _readout(model: nn.Module, row: GraftRow) -> tuple[str | None, str | None]:
    """Whose final norm and unembedding read out ``row`` (donor names; None: ``model``'s)."""
    arch = architecture_of(unwrap(model))
    spans = {name: list(p) for name, p in row.spans.items()}
    resolved = row.spec.resolve(arch, len(row.input_ids), spans)
    return resolved.final_norm_donor, resolved.unembed_donor


def _module(
    model: nn.Module, donors: Mapping[str, nn.Module], owner: str | None, which: str
) -> nn.Module:
    """The final norm or unembedding (``which``: the family table's path field) of ``owner``."""
    of = unwrap(model) if owner is None else unwrap(donors[owner])
    return of.get_submodule(getattr(architecture_of(of).table, which))


def _softcap(model: nn.Module) -> float | None:
    """The logit soft-capping the model's forward applies after its head (Gemma 2), if any."""
    return getattr(unwrap(model).config, "final_logit_softcapping", None)


@torch.no_grad()
def _decode(
    states: torch.Tensor,
    norm: nn.Module,
    unembed: nn.Module,
    targets: torch.Tensor,
    softcap: float | None,
    top_k: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rank and log-probability of ``targets`` [rows], and the ``top_k`` tokens and their
    log-probabilities, under the readout of ``states`` [rows, layers, positions, hidden], one
    layer at a time (rows x positions logits each)."""
    ranks, logprobs, top_ids, top_lps = [], [], [], []
    for layer in range(states.shape[1]):
        logits = unembed(norm(states[:, layer])).to("cpu", torch.float32)  # [rows, pos, V]
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        index = targets[:, None, None].expand(-1, logits.shape[1], 1)
        target_logit = logits.gather(-1, index)
        ranks.append((logits > target_logit).sum(-1))
        log_softmax = torch.log_softmax(logits, dim=-1)
        logprobs.append(log_softmax.gather(-1, index).squeeze(-1))
        ids = logits.topk(min(top_k, logits.shape[-1]), dim=-1).indices  # by logit, as ranked
        top_ids.append(ids)
        top_lps.append(log_softmax.gather(-1, ids))
    return (
        torch.stack(ranks, dim=1),
        torch.stack(logprobs, dim=1),
        torch.stack(top_ids, dim=1),
        torch.stack(top_lps, dim=1),
    )


def top_width(model: nn.Module, top_k: int) -> int:
    """How many top tokens :func:`logit_lens` keeps for ``top_k`` on ``model``: at most its
    vocabulary (the rows of its unembedding)."""
    unembed = _module(model, {}, None, "unembed_path").get_parameter("weight")
    return min(top_k, unembed.shape[0])
