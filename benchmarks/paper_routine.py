"""The paper's grafting routine, implemented on its own: the baseline the engine is timed against.

Token by token with a KV cache. Before each position ``t`` the base model is deep-copied (as
the paper's code did) and the donor's weights of every (layer, component) cell that a graft
maps ``t`` to are copied into the copy; then the copy runs the one token ``t``. Keys and values
cached at earlier positions keep the weights that were active at their own position. For a
fused QKV projection only the output features of the grafted slice (q, k or v) are copied.

Nothing here imports the engine; only the spec resolution (which cells a graft uses) and the
architecture table (which module computes a component) are graft's.
tests/benchmarks/test_paper_routine.py checks it against the engine; benchmarks.real_model
times it.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeVar

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from graft.core import Architecture, GraftSpec, ResolvedGraft, architecture_of

_SLICE_INDEX = {"q": 0, "k": 1, "v": 2}


class Row(Protocol):
    """What the routine reads of a row (a ``GraftRow`` has it)."""

    input_ids: Sequence[int]
    spans: Mapping[str, Sequence[int]]
    spec: GraftSpec


R = TypeVar("R", bound=Row)

# (module path, output features to copy or None for the whole module, donor name)
_Load = tuple[str, torch.Tensor | None, str]


def fused_features(layout: str, component: str, width: int, n_heads: int) -> torch.Tensor:
    """Output features of ``component`` (q, k or v) in a fused QKV output ``width`` wide.

    ``"thirds"`` (GPT-2) lays the features out as ``[q | k | v]``; ``"heads"`` (GPT-NeoX) as
    ``[head, (q | k | v), head_dim]``.
    """
    which = _SLICE_INDEX[component]
    if layout == "thirds":
        third = width // 3
        return torch.arange(which * third, (which + 1) * third)
    head_dim = width // (3 * n_heads)
    starts = torch.arange(n_heads) * 3 * head_dim + which * head_dim
    return (starts.unsqueeze(1) + torch.arange(head_dim)).reshape(-1)


def _loads_by_position(
    model: nn.Module, arch: Architecture, resolved: ResolvedGraft, length: int
) -> dict[int, list[_Load]]:
    """Position -> the weight loads the paper's routine makes before running that token."""
    loads: dict[int, list[_Load]] = {}
    for (layer, component), cell in resolved.cells.items():
        path, site = arch.site_for(layer, component)
        features = None
        if site.fused:
            module = model.get_submodule(path)
            width = module.weight.shape[1 if isinstance(module, Conv1D) else 0]
            features = fused_features(site.fused, component, width, arch.n_heads)
        for position, donor in cell.items():
            loads.setdefault(position, []).append((path, features, donor))
    last = length - 1
    if resolved.final_norm_donor:
        loads.setdefault(last, []).append(
            (arch.table.final_norm_path, None, resolved.final_norm_donor)
        )
    if resolved.unembed_donor:
        loads.setdefault(last, []).append((arch.table.unembed_path, None, resolved.unembed_donor))
    return loads


def load_weights(target: nn.Module, source: nn.Module, features: torch.Tensor | None) -> None:
    """Copy ``source``'s parameters into ``target`` (only ``features`` of the output if given)."""
    params = dict(source.named_parameters())
    for name, param in target.named_parameters():
        src = params[name].to(param.dtype)
        if features is None:
            param.copy_(src)
        elif param.dim() == 1:  # bias: one entry per output feature
            param[features] = src[features]
        elif isinstance(target, Conv1D):  # weight [in, out]
            param[:, features] = src[:, features]
        else:  # nn.Linear weight [out, in]
            param[features] = src[features]


def _untie_unembedding(work: nn.Module) -> None:
    """Give the copy's unembedding its own tensor, so that loading ``embed`` leaves it alone."""
    out = work.get_output_embeddings()
    if out.weight is work.get_input_embeddings().weight:
        out.weight = nn.Parameter(out.weight.detach().clone(), requires_grad=False)


@torch.no_grad()
def paper_last_logits(
    base: nn.Module,
    donors: Mapping[str, nn.Module],
    input_ids: Sequence[int],
    resolved: ResolvedGraft,
    arch: Architecture | None = None,
) -> torch.Tensor:
    """Logits (float32, or float64 for a float64 model) at the last token of one prompt.

    Args:
        base: the base causal LM.
        donors: donor name -> causal LM of the same architecture.
        input_ids: the prompt's token ids.
        resolved: the graft resolved on this prompt (``GraftSpec.resolve``).
        arch: ``architecture_of(base)`` (computed when not given).
    """
    arch = arch or architecture_of(base)
    length = len(input_ids)
    loads = _loads_by_position(base, arch, resolved, length)
    device = next(base.parameters()).device
    ids = torch.tensor([list(input_ids)], dtype=torch.long, device=device)
    embed_path = arch.table.embed_sites[0].path
    past, logits = None, None
    for t in range(length):
        work = copy.deepcopy(base).eval()
        here = loads.get(t, [])
        if t == length - 1 and any(path == embed_path for path, _, _ in here):
            _untie_unembedding(work)  # the readout's unembedding follows the head policy only
        for path, features, donor in here:
            load_weights(work.get_submodule(path), donors[donor].get_submodule(path), features)
        out = work(
            input_ids=ids[:, t : t + 1],
            attention_mask=torch.ones((1, t + 1), dtype=torch.long, device=device),
            position_ids=torch.tensor([[t]], dtype=torch.long, device=device),
            use_cache=True,
            **{
                "cache"
                if "cache" in inspect.signature(work.forward).parameters
                else "past_key_values": past
            },
        )
        past, logits = out["cache" if "cache" in out else "past_key_values"], out.logits
        del work
    last = logits[0, -1]
    return last if last.dtype == torch.float64 else last.float()


def stacked_rows(
    base: nn.Module,
    rows: Sequence[R],
    last_logits: Callable[[R, ResolvedGraft, Architecture], torch.Tensor],
) -> torch.Tensor:
    """``last_logits(row, resolved, arch)`` of every row, its graft resolved on ``base``'s
    architecture ``arch`` at the row's length and spans, stacked: [rows, vocab] on the CPU."""
    arch = architecture_of(base)
    out = []
    for row in rows:
        spans = {k: list(v) for k, v in row.spans.items()}
        resolved = row.spec.resolve(arch, len(row.input_ids), spans)
        out.append(last_logits(row, resolved, arch).cpu())
    return torch.stack(out)


def paper_rows(
    base: nn.Module, donors: Mapping[str, nn.Module], rows: Sequence[Row]
) -> torch.Tensor:
    """``paper_last_logits`` of every row, stacked: [rows, vocab] on the CPU."""

    def last_logits(row: Row, resolved: ResolvedGraft, arch: Architecture) -> torch.Tensor:
        return paper_last_logits(base, donors, row.input_ids, resolved, arch)

    return stacked_rows(base, rows, last_logits)
