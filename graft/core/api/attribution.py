"""``graft.attribute``: every cell's graft effect on a target, estimated from one forward and
one backward pass of the ungrafted base per batch.

A cell is (layer, position unit, module kind). Grafting it replaces the output ``y = m(x)``
of the base's module ``m`` at the unit's positions by the donor's ``m'(x)``. To first order
in that output change, the graft moves the metric ``f`` (the target's first-token log-prob,
or its logit) by

    estimate = sum over the unit's positions p of  dL/dy_p . (m'(x_p) - m(x_p))

where ``x`` is the base's input to ``m`` and ``dL/dy`` the gradient of ``f`` with respect to
``m``'s output, both from the plain base run. One forward gives every ``x``, ``y`` and
``m'(x)`` (each donor module is called on the base's input inside a forward hook), one
backward every gradient, so all cells of a batch cost about one forward and one backward.

Kinds: a leaf component of the spec language (``q``, ``k``, ``v``, ``o``, ``gate``, ``up``,
``down``, norms; fused QKV sliced as the engine slices it) is its own module; ``mlp`` /
``ffn`` is the whole MLP module (its output change is exact for gate, up and down grafted
together: the MLP works position by position); any other group (``attn``, ``qkv``,
``ffn_up``, ``norms``) is the sum of its leaves' estimates, first order in each. That is
the ``linear`` estimator; the default, ``local``, computes the attention block's change
exactly for the kinds inside it (``q``, ``k``, ``v``, ``o``, ``qkv``, ``attn``) and linearises
only downstream of the block (:mod:`graft.core.api.attribution_local`).
The estimate is exact for a linear metric of a linear change; it fails where a graft
changes the base far from it (multi-cell grafts, large finetunes), which
``graft-exp attribution --verify K``
(:func:`graft.core.api.attribution_verify.verify_attribution`) measures against real grafts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from graft.core.api.attribution_local import AttentionCapture, block_kinds, local_effects
from graft.core.api.texts import (
    _field_list,
    _prompt_list,
    _rows,
    _spec_list,
    _tokenizer,
)
from graft.core.execution.inputs import as_donors, model_of
from graft.core.families.arch import Architecture, Site, architecture_of, check_compatible
from graft.core.families.wrapping import unwrap
from graft.core.language.vocabulary import (
    ATTRIBUTION_METRICS,
    COMPONENT_GROUPS,
    DEFAULT_KINDS,
    ESTIMATORS,
)
from graft.errors import SpecError

__all__ = ["DEFAULT_KINDS", "ESTIMATORS", "attribute"]

_MODULE_KINDS = ("mlp", "ffn")  # the whole MLP module, whose output change is exact


def _texts_only(texts: Any) -> list[str]:
    """The prompts of ``texts``, which must be texts here (targets follow their text)."""
    prompts = _prompt_list(texts)
    if not all(isinstance(p, str) for p in prompts):
        raise SpecError(
            "attribution takes prompts as texts (its targets follow the text); decode token ids first"
        )
    return [str(p) for p in prompts]


def attribute(
    base: Any,
    donors: Any,
    tokenizer: Any,
    texts: Sequence[str] | str,
    targets: Sequence[int | str] | int | str,
    *,
    fields: Sequence[Mapping[str, str]] | Mapping[str, str] | None = None,
    units: Sequence[str] | None = None,
    kinds: Sequence[str] = DEFAULT_KINDS,
    layers: Sequence[int] | None = None,
    donor: str | None = None,
    metric: str = "logprob",
    batch_size: int = 8,
    estimator: str = "local",
) -> Any:
    """Estimate every cell's graft effect on the target from the ungrafted base's gradients.

    For a cell (layer ``l``, unit ``U``, kind ``m``) the estimate of
    ``f(graft "U:l:m") - f(base)`` is ``sum_{p in U} grad_y f[p] . (m_donor(x)[p] - y[p])``,
    ``x`` the base's input to module ``m``, ``y = m_base(x)`` its output (see the module
    docstring; groups such as ``attn`` sum their leaves): the ``linear`` estimator. The
    default, ``local``, replaces it for the kinds inside the attention block by
    ``sum_p grad_z f[p] . (A(x; m donor at U)[p] - A(x)[p])`` over every position, ``A`` the
    attention block run on the base's input with the cell grafted (exact in the block,
    linear downstream; :mod:`graft.core.api.attribution_local`). ``f`` is the log-prob of
    the target's first token at the last position (``metric="logit"``: its logit).

    Args:
        base, donors, tokenizer, texts, fields: as for :func:`graft.graft_texts`.
        targets: per text (or one for all) the target: a token id, or a text whose first
            token is the target (mind the leading space).
        units: position units: ``LT`` (the last token), ``ALL`` (every position) and named
            spans of ``fields`` (e.g. ``FE``); default ``LT`` and every span of each text.
        kinds: module kinds, as the spec language names them (default
            :data:`DEFAULT_KINDS`).
        layers: layers to attribute (default all).
        donor: the donor's name when ``donors`` holds several (default: the only one).
        metric: ``"logprob"`` (default) or ``"logit"``.
        batch_size: texts per forward and backward.
        estimator: ``"local"`` (default) or ``"linear"``, as above.

    Returns:
        a polars table ``prompt`` (the text's index), ``layer``, ``unit``, ``kind``,
        ``estimate``, one row per cell.
    """
    import polars as pl

    tokenizer = _tokenizer(base, tokenizer)
    text_list = _texts_only(texts)
    target_ids = _target_ids(tokenizer, targets, text_list)
    if metric not in ATTRIBUTION_METRICS:
        raise SpecError(f"metric {metric!r}: choose one of {', '.join(ATTRIBUTION_METRICS)}")
    if estimator not in ESTIMATORS:
        raise SpecError(f"estimator {estimator!r}: choose one of {', '.join(ESTIMATORS)}")
    torch_base = unwrap(model_of(base))
    torch_donor = one_donor(donors, donor)
    check_compatible(torch_base, torch_donor)
    arch = architecture_of(torch_base)
    layer_list = list(range(arch.n_layers)) if layers is None else [int(x) for x in layers]
    if any(not 0 <= x < arch.n_layers for x in layer_list):
        raise SpecError(f"layers must lie in 0..{arch.n_layers - 1}")
    leaves = {kind: _leaves(arch, kind) for kind in kinds}
    local = block_kinds(arch, leaves) if estimator == "local" else []
    rows = _rows(tokenizer, text_list, _spec_list("none"), fields)
    records: list[dict[str, Any]] = []
    for start in range(0, len(rows), max(1, batch_size)):
        batch = rows[start : start + max(1, batch_size)]
        spans = []
        for r in batch:
            last = len(r.input_ids) - 1
            spans.append({**r.spans, "LT": [last], "ALL": list(range(last + 1))})
        row_units = [_units(units, s, start + i) for i, s in enumerate(spans)]
        per_pos, per_unit = _batch_effects(
            torch_base,
            torch_donor,
            arch,
            batch,
            target_ids[start : start + len(batch)],
            layer_list,
            leaves,
            metric,
            {kind: leaves[kind] for kind in local},
            _unit_masks(spans, row_units),
        )
        for i in range(len(batch)):
            for unit in row_units[i]:
                for layer in layer_list:
                    for kind in leaves:
                        if kind in local:
                            value = float(per_unit[(layer, kind, unit)][i])
                        else:
                            value = float(per_pos[(layer, kind)][i, spans[i][unit]].sum())
                        records.append(
                            {
                                "prompt": start + i,
                                "layer": layer,
                                "unit": unit,
                                "kind": kind,
                                "estimate": value,
                            }
                        )
    schema = {"prompt": pl.Int64, "layer": pl.Int64, "unit": pl.Utf8, "kind": pl.Utf8}
    return pl.DataFrame(records, schema={**schema, "estimate": pl.Float64})


def metric_scores(logits: torch.Tensor, metric: str) -> torch.Tensor:
    """What ``metric`` measures of each token from ``logits`` [rows, vocab]: its log-prob
    (``"logprob"``) or its raw logit."""
    return logits.log_softmax(-1) if metric == "logprob" else logits


def prompt_inputs(
    base: Any,
    tokenizer: Any,
    texts: Sequence[str] | str,
    targets: Sequence[int | str] | int | str,
    fields: Sequence[Mapping[str, str]] | Mapping[str, str] | None,
) -> tuple[Any, list[str], list[int], list[Mapping[str, Any]]]:
    """The tokenizer (given, or the base's), the texts, and each text's target id and fields,
    as the checks against real grafts read them
    (:mod:`graft.core.api.attribution_verify`)."""
    tokenizer = _tokenizer(base, tokenizer)
    text_list = _texts_only(texts)
    target_ids = _target_ids(tokenizer, targets, text_list)
    return tokenizer, text_list, target_ids, _field_list(fields, text_list)


def one_donor(donors: Any, name: str | None) -> torch.nn.Module:
    models = as_donors(donors)
    if name is None:
        if len(models) != 1:
            raise SpecError(f"donors holds {sorted(models)}: name one with donor=...")
        name = next(iter(models))
    if models.get(name) is None:
        raise SpecError(f"no donor model named {name!r}; donors: {sorted(models)}")
    return unwrap(models[name])


def _target_ids(tokenizer: Any, targets: Any, texts: list[str]) -> list[int]:
    items = [targets] * len(texts) if isinstance(targets, int | str) else list(targets)
    if len(items) != len(texts):
        raise SpecError(f"targets: one per text ({len(texts)}), or one for all")
    ids = []
    for target in items:
        if isinstance(target, str):
            tokens = tokenizer(target, add_special_tokens=False)["input_ids"]
            if not tokens:
                raise SpecError(f"the target {target!r} tokenizes to nothing; give a text")
            target = tokens[0]
        ids.append(int(target))
    return ids


def _leaves(arch: Architecture, kind: str) -> list[str]:
    """The leaf components whose estimates make up ``kind`` ([kind] for the MLP module)."""
    if kind in _MODULE_KINDS:
        return [kind]
    parts = COMPONENT_GROUPS.get(kind, (kind,))
    present = [c for c in parts if c in arch.components]
    if not present:
        raise SpecError(
            f"kind {kind!r} names no component of the {arch.family} family; use e.g. "
            f"{', '.join(DEFAULT_KINDS)}"
        )
    return present


def _units(
    units: Sequence[str] | None, spans: Mapping[str, Sequence[int]], prompt: int
) -> list[str]:
    if units is None:
        return [*sorted(u for u in spans if u not in ("LT", "ALL")), "LT"]
    missing = [u for u in units if u not in spans]
    if missing:
        raise SpecError(
            f"prompt {prompt} has no unit {missing[0]!r}: units are LT, ALL and the spans of fields "
            f"({', '.join(sorted(spans))})"
        )
    return list(units)


def _unit_masks(
    spans: Sequence[Mapping[str, Sequence[int]]], row_units: Sequence[Sequence[str]]
) -> dict[str, torch.Tensor]:
    """Each unit of any row as a bool mask [rows, longest row] of its positions."""
    width = max(len(s["ALL"]) for s in spans)
    masks: dict[str, torch.Tensor] = {}
    for i, units in enumerate(row_units):
        for unit in units:
            mask = masks.setdefault(unit, torch.zeros((len(spans), width), dtype=torch.bool))
            mask[i, list(spans[i][unit])] = True
    return masks


def _mlp_path(arch: Architecture, layer: int) -> str:
    down = arch.site_for(layer, "down")[0]
    return down.rsplit(".", 1)[0]


def _slice(site: Site, component: str, t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The part of a (fused) site's output that computes ``component``."""
    if site.fused is None:
        return t
    index = site.components.index(component)
    if site.fused == "thirds":
        return t.chunk(3, dim=-1)[index]
    shaped = t.reshape(*t.shape[:-1], n_heads, 3, -1)  # heads: [head, (q | k | v), head_dim]
    return shaped[..., index, :]


def _batch_effects(
    base: torch.nn.Module,
    donor: torch.nn.Module,
    arch: Architecture,
    rows: Sequence[Any],
    target_ids: list[int],
    layers: list[int],
    leaves: Mapping[str, list[str]],
    metric: str,
    local: Mapping[str, list[str]],
    unit_rows: Mapping[str, torch.Tensor],
) -> tuple[dict[tuple[int, str], torch.Tensor], dict[tuple[int, str, str], torch.Tensor]]:
    """Per (layer, kind) of the linear kinds (``leaves`` but ``local``): the estimate at each
    (row, position) [rows, longest row], the rows right-padded (position p of row i at
    column p); per (layer, kind, unit) of the ``local`` kinds: each row's estimate [rows]."""
    linear = {kind: parts for kind, parts in leaves.items() if kind not in local}
    paths: dict[str, Site | None] = {}  # module path -> its site (None: the MLP module)
    for layer in layers:
        for parts in linear.values():
            for leaf in parts:
                if leaf in _MODULE_KINDS:
                    paths[_mlp_path(arch, layer)] = None
                else:
                    path, site = arch.site_for(layer, leaf)
                    paths[path] = site
    deltas: dict[str, torch.Tensor] = {}
    outputs: dict[str, torch.Tensor] = {}

    def hook(path: str, donor_module: torch.nn.Module) -> Any:
        def run(module: Any, args: Any, kwargs: Any, out: Any) -> None:
            if not isinstance(out, torch.Tensor):
                raise SpecError(f"module {path} returns {type(out).__name__}, not a tensor")
            with torch.no_grad():
                d_args = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
                deltas[path] = donor_module(*d_args, **kwargs) - out.detach()
            out.retain_grad()
            outputs[path] = out

        return run

    def needs_grad(module: Any, args: Any, out: Any) -> Any:
        # the backward reaches every module output even when the weights are frozen
        return out if out.requires_grad else out.detach().requires_grad_(True)

    handles = [
        base.get_submodule(s.path).register_forward_hook(needs_grad) for s in arch.table.embed_sites
    ]
    for path in paths:
        handles.append(
            base.get_submodule(path).register_forward_hook(
                hook(path, donor.get_submodule(path)), with_kwargs=True
            )
        )
    width = max(len(r.input_ids) for r in rows)
    device = next(base.parameters()).device
    ids = torch.zeros((len(rows), width), dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    lasts = [len(r.input_ids) - 1 for r in rows]
    # right padding: a pad query sees the row's real keys, so no attention row is fully
    # masked (left padding leaves pad rows with none, which is NaN in some families'
    # float64 attention, gemma2's, and a NaN gradient reaches the real positions)
    for i, r in enumerate(rows):
        ids[i, : len(r.input_ids)] = torch.tensor(r.input_ids)
        mask[i, : len(r.input_ids)] = 1
    positions = torch.arange(width, device=device).expand(len(rows), width)
    capture = AttentionCapture(base, arch, layers if local else [])
    try:
        with torch.enable_grad():
            logits = base(
                input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False
            ).logits
            last = logits[torch.arange(len(rows), device=logits.device), lasts]
            last = last.float() if last.dtype != torch.float64 else last
            scores = metric_scores(last, metric)
            target = torch.tensor(target_ids, device=scores.device)
            scores.gather(1, target[:, None]).sum().backward()
    finally:
        capture.remove()
        for handle in handles:
            handle.remove()
    per_unit = local_effects(capture, base, donor, arch, layers, local, unit_rows)
    effects: dict[tuple[int, str], torch.Tensor] = {}
    for layer in layers:
        for kind, parts in linear.items():
            total = ids.new_zeros((len(rows), width), dtype=torch.float64)
            for leaf in parts:
                if leaf in _MODULE_KINDS:
                    path, site = _mlp_path(arch, layer), Site("mlp", ("mlp",))
                else:
                    path, site = arch.site_for(layer, leaf)
                out = outputs[path]
                grad = out.grad if out.grad is not None else torch.zeros_like(out)
                product = (
                    _slice(site, leaf, grad, arch.n_heads).double()
                    * _slice(site, leaf, deltas[path], arch.n_heads).double()
                )
                seq = site.seq_dim
                keep = product.movedim(seq, 1).reshape(len(rows), width, -1).sum(-1)
                total += keep
            effects[(layer, kind)] = total.cpu()
    return effects, per_unit
