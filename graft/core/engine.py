"""The one-pass grafted forward: many (prompt, graft) rows per batch, one nnsight trace.

Why one pass is exact (DESIGN.md §1): every parameterised module of a decoder acts on each
position on its own, so running the base once and replacing, at the grafted positions, each
grafted module's output by what the DONOR's module computes on the SAME input the base run
fed it, equals the paper's token-by-token weight swap. Keys and values written at grafted
positions then carry the donor's projections to every later position.

Per batch the engine pads the rows (left by default, with explicit position ids), turns each
row's spec into boolean [batch, position] masks per module ("site"), and inside one trace
visits the grafted sites in forward order: it gathers the grafted rows of the site's input,
runs the donor's module on them only and scatters the result into the site's output. For a
fused QKV projection the donor output is merged slice by slice (q, k or v alone).
"""

from __future__ import annotations

import copy
import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from graft.core.arch import Architecture, architecture_of, check_compatible
from graft.core.spec import GraftSpec, ResolvedGraft, SpecError
from graft.models import LoadedModel, context_length

_SLICE_INDEX = {"q": 0, "k": 1, "v": 2}


@dataclass
class GraftRow:
    """One (prompt, graft) pair.

    Args:
        input_ids: token ids of the prompt (BOS included if the model expects one).
        spans: named token positions, e.g. ``{"FE": [1, 2], "M": [5, 6, 7]}``.
        spec: the graft to apply to this prompt.
    """

    input_ids: Sequence[int]
    spans: Mapping[str, Sequence[int]] = field(default_factory=dict)
    spec: GraftSpec = field(default_factory=GraftSpec)


@dataclass
class SitePatch:
    """What one donor replaces at one module in one batch.

    Args:
        path: module path in the base model.
        donor: donor name.
        rows: bool [batch, positions]: where the donor's module output is used at all.
        fused: ``None``, ``"thirds"`` or ``"heads"`` (fused QKV layout).
        slices: for fused sites, ``(slice index 0/1/2, bool [n_selected])`` pairs saying which
            of q, k, v to take at each selected position; empty means the whole output.
        n_heads: attention heads (for ``"heads"`` slicing).
        seq_dim: dimension of the positions in the module's input and output.
    """

    path: str
    donor: str
    rows: torch.Tensor
    fused: str | None = None
    slices: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    n_heads: int = 1
    seq_dim: int = 1


@dataclass
class BatchPlan:
    """A padded batch and its patches, in forward order.

    Args:
        input_ids: [batch, positions] padded ids.
        attention_mask: [batch, positions] 1 for real tokens.
        position_ids: [batch, positions] positions counted from each prompt's first token.
        last_index: [batch] index of each row's last real token.
        patches: site patches in the order the forward pass reaches their modules.
        keep_last_only: whether only the last position's logits are computed (left padding).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    last_index: torch.Tensor
    patches: list[SitePatch]
    keep_last_only: bool


def _site_order(arch: Architecture) -> list[tuple[str, object]]:
    """Every replaceable module path with its site, in forward order; head last."""
    order: list[tuple[str, object]] = [(s.path, s) for s in arch.table.embed_sites]
    for layer in range(arch.n_layers):
        order += [(arch.layer_site_path(layer, s), s) for s in arch.table.layer_sites]
    order.append((arch.table.final_norm_path, None))
    order.append((arch.table.unembed_path, None))
    return order


def plan_batch(
    arch: Architecture,
    rows: Sequence[GraftRow],
    *,
    pad_id: int = 0,
    padding_side: str = "left",
    resolved: Sequence[ResolvedGraft] | None = None,
) -> BatchPlan:
    """Pad ``rows`` and turn their specs into per-site masks (no model is run)."""
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', not {padding_side!r}")
    lengths = [len(r.input_ids) for r in rows]
    if min(lengths) < 1:
        raise SpecError("a prompt has no tokens")
    batch, width = len(rows), max(lengths)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, width), dtype=torch.long)
    position_ids = torch.zeros((batch, width), dtype=torch.long)
    offsets = []
    for i, (row, n) in enumerate(zip(rows, lengths, strict=True)):
        off = width - n if padding_side == "left" else 0
        offsets.append(off)
        input_ids[i, off : off + n] = torch.as_tensor(list(row.input_ids), dtype=torch.long)
        attention_mask[i, off : off + n] = 1
        position_ids[i, off : off + n] = torch.arange(n)
    last_index = torch.tensor([o + n - 1 for o, n in zip(offsets, lengths, strict=True)])
    if resolved is None:
        resolved = [
            r.spec.resolve(arch, n, {k: list(v) for k, v in r.spans.items()})
            for r, n in zip(rows, lengths, strict=True)
        ]

    # (path, donor) -> {"rows": mask, "comp_masks": {slice_index: mask}}
    masks: dict[tuple[str, str], dict] = {}

    def mark(path: str, site, donor: str, component: str | None, row: int, pos: int) -> None:
        entry = masks.setdefault(
            (path, donor),
            {"rows": torch.zeros((batch, width), dtype=torch.bool), "slices": {}, "site": site},
        )
        entry["rows"][row, pos] = True
        if site is not None and site.fused:
            sl = entry["slices"].setdefault(
                _SLICE_INDEX[component], torch.zeros((batch, width), dtype=torch.bool)
            )
            sl[row, pos] = True

    for i, res in enumerate(resolved):
        for (layer, comp), cell in res.cells.items():
            path, site = arch.site_for(layer, comp)
            for pos, donor in cell.items():
                mark(path, site, donor, comp, i, pos + offsets[i])
        last = int(last_index[i])
        if res.final_norm_donor:
            mark(arch.table.final_norm_path, None, res.final_norm_donor, None, i, last)
        if res.unembed_donor:
            mark(arch.table.unembed_path, None, res.unembed_donor, None, i, last)

    patches: list[SitePatch] = []
    for path, site in _site_order(arch):
        for (p, donor), entry in masks.items():
            if p != path:
                continue
            rows_mask = entry["rows"]
            slices = []
            if site is not None and site.fused:
                full = all(k in entry["slices"] for k in range(3)) and all(
                    torch.equal(entry["slices"][k], rows_mask) for k in range(3)
                )
                if not full:
                    for k, m in sorted(entry["slices"].items()):
                        slices.append((k, m[rows_mask]))
            patches.append(
                SitePatch(
                    path=path,
                    donor=donor,
                    rows=rows_mask,
                    fused=site.fused if site is not None else None,
                    slices=slices,
                    n_heads=arch.n_heads,
                    seq_dim=site.seq_dim if site is not None else 1,
                )
            )
    return BatchPlan(
        input_ids, attention_mask, position_ids, last_index, patches, padding_side == "left"
    )


def _merge_slices(base_out, donor_out, patch_fused, slices, n_heads):
    """Take q/k/v slices of a fused projection from the donor where ``slices`` say so."""
    merged = base_out.clone()
    width = base_out.shape[-1]
    if patch_fused == "thirds":
        third = width // 3
        for k, sel in slices:
            merged[sel, k * third : (k + 1) * third] = donor_out[sel, k * third : (k + 1) * third]
        return merged
    # "heads": features laid out as [head, (q|k|v), head_dim]
    view_m = merged.view(merged.shape[0], n_heads, 3, width // (3 * n_heads))
    view_d = donor_out.view(donor_out.shape[0], n_heads, 3, width // (3 * n_heads))
    for k, sel in slices:
        view_m[sel, :, k] = view_d[sel, :, k]
    return merged


def _placed(module, x):
    """``module``, or a copy of it on ``x``'s device (and float dtype) if its weights are elsewhere.

    Locally donor and base share device and dtype, so this returns ``module`` itself. Donor
    weights shipped to a remote server arrive on its CPU in the donor's dtype; the copy keeps
    the server from mixing devices or dtypes (and leaves the caller's module untouched).
    """
    if not isinstance(module, nn.Module):
        return module
    p = next(module.parameters(), None)
    if p is None:
        return module
    dtype = x.dtype if x.is_floating_point() else p.dtype
    if p.device == x.device and p.dtype == dtype:
        return module
    return copy.deepcopy(module).to(device=x.device, dtype=dtype)


def graft_trace_body(model, patches, donor_modules):
    """Apply ``patches`` inside an open trace of ``model``; the nnsight-side half of the engine.

    ``donor_modules`` maps ``"donor:path"`` to a callable module (a plain torch module of the
    donor, or, on a hosted server, the donor module the server holds). Kept free of closures
    and globals beyond torch so that nnsight's remote serialiser can ship it.
    """
    with torch.no_grad():
        current = None
        for patch in patches:
            env = model.get(patch.path)
            if current is None or current[0] != patch.path:
                if current is not None:
                    current[1].output = current[3]
                args, kwargs = env.inputs
                x = args[0] if len(args) > 0 else next(iter(kwargs.values()))
                out = env.output
                current = [patch.path, env, x, out.clone()]
            x, new = current[2], current[3]
            if patch.seq_dim != 1:  # e.g. [batch, heads, positions, head_dim]: views, no copy
                x, new = x.transpose(1, patch.seq_dim), new.transpose(1, patch.seq_dim)
            rows = patch.rows
            if rows.device != new.device:  # remote: the masks travel on the CPU
                rows = rows.to(new.device)
            if rows.shape[1] != new.shape[1]:  # lm head under logits_to_keep
                rows = rows[:, rows.shape[1] - new.shape[1] :]
            module = _placed(donor_modules[patch.donor + ":" + patch.path], x)
            donor_out = module(x[rows])
            if patch.fused and patch.slices:
                slices = [(k, m.to(new.device)) for k, m in patch.slices]
                donor_out = _merge_slices(new[rows], donor_out, patch.fused, slices, patch.n_heads)
            new[rows] = donor_out.to(new.dtype)
        if current is not None:
            current[1].output = current[3]


_WRAPPED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def wrap(model: nn.Module):
    """The nnsight wrapper of ``model`` (cached per model object; no copy of the weights)."""
    if hasattr(model, "trace") and hasattr(model, "get"):
        return model
    wrapped = _WRAPPED.get(model)
    if wrapped is None:
        from nnsight import NNsight

        wrapped = NNsight(model)
        _WRAPPED[model] = wrapped
    return wrapped


def _unwrap(model) -> nn.Module:
    inner = getattr(model, "_model", None)
    return inner if isinstance(inner, nn.Module) else model


def _donor_modules(donors: Mapping[str, nn.Module], patches: Sequence[SitePatch]) -> dict:
    mods = {}
    for p in patches:
        key = f"{p.donor}:{p.path}"
        if key not in mods:
            if p.donor not in donors:
                raise SpecError(
                    f"the graft uses donor {p.donor!r} but only {sorted(donors) or 'none'} were "
                    "given; pass it in donors={...}"
                )
            mods[key] = _unwrap(donors[p.donor]).get_submodule(p.path)
    return mods


def _supports_logits_to_keep(model: nn.Module) -> bool:
    import inspect

    return "logits_to_keep" in inspect.signature(model.forward).parameters


def run_plan(
    base,
    donors: Mapping[str, nn.Module],
    plan: BatchPlan,
    *,
    remote: bool | str = False,
    backend=None,
    donor_modules: Mapping[str, Callable] | None = None,
) -> torch.Tensor:
    """Run one planned batch; returns float32 logits [batch, vocab] at each row's last token."""
    model = wrap(base)
    torch_model = _unwrap(base)
    device = next(torch_model.parameters()).device
    if device.type == "meta":  # a weightless client-side copy of a remotely served base
        device = torch.device("cpu")
    keep_last = plan.keep_last_only and _supports_logits_to_keep(torch_model)
    kwargs = dict(
        input_ids=plan.input_ids.to(device),
        attention_mask=plan.attention_mask.to(device),
        position_ids=plan.position_ids.to(device),
    )
    if keep_last:
        kwargs["logits_to_keep"] = 1
    # a donor that IS the base computes what the base computes: nothing to replace (and
    # calling the base's own module inside its trace would recurse)
    same = {name for name, d in donors.items() if _unwrap(d) is torch_model}
    patches = [
        SitePatch(
            p.path,
            p.donor,
            p.rows.to(device),
            p.fused,
            [(k, m.to(device)) for k, m in p.slices],
            p.n_heads,
            p.seq_dim,
        )
        for p in plan.patches
        if p.donor not in same
    ]
    mods = dict(donor_modules) if donor_modules is not None else _donor_modules(donors, patches)
    trace_kwargs = {}
    if remote or backend is not None:
        from graft.remote.client import prepare_remote_trace

        # plain-data patches, engine shipped by value, remote="local" on any wrapper
        patches, mods, backend, remote = prepare_remote_trace(model, patches, mods, remote, backend)
    if remote:
        trace_kwargs["remote"] = remote
    if backend is not None:
        trace_kwargs["backend"] = backend
    # only each row's last-position logits leave the trace (small remote results)
    batch_rows = torch.arange(plan.input_ids.shape[0])
    pick = torch.full_like(batch_rows, -1) if keep_last else plan.last_index.clone()
    with torch.no_grad(), model.trace(**kwargs, **trace_kwargs):
        graft_trace_body(model, patches, mods)
        full = model.output.logits
        logits = full[batch_rows.to(full.device), pick.to(full.device)].save()
    if logits.dtype != torch.float64:
        logits = logits.float()
    return logits.cpu()


def default_pad_id(config) -> int:
    """The config's pad id, else its eos id, else 0 (padded positions are masked anyway)."""
    for value in (getattr(config, "pad_token_id", None), getattr(config, "eos_token_id", None)):
        if isinstance(value, int):
            return value
    return 0


def _model_of(model):
    """The model itself when given a :class:`graft.models.LoadedModel`."""
    return model.model if isinstance(model, LoadedModel) else model


def as_donors(donors) -> dict:
    """``{name: model}`` from a mapping, one model (named ``"sft"``) or ``None`` (no donors);
    :class:`graft.models.LoadedModel` values are unwrapped."""
    if donors is None:
        return {}
    if isinstance(donors, nn.Module | LoadedModel) or hasattr(donors, "trace"):
        donors = {"sft": donors}
    if not isinstance(donors, Mapping):
        raise SpecError(
            f"donors must be a model or a {{name: model}} mapping, not {type(donors).__name__}"
        )
    return {name: _model_of(d) for name, d in donors.items()}


def _check_lengths(model: nn.Module, rows: Sequence[GraftRow]) -> None:
    """Refuse prompts longer than the positions the model was built for (GPT-2's learned
    positions would fail mid-run with an IndexError)."""
    limit = context_length(model)
    for i, row in enumerate(rows):
        if limit is not None and len(row.input_ids) > limit:
            raise SpecError(
                f"prompt {i} has {len(row.input_ids)} tokens but the model has only {limit} "
                "positions; shorten the prompt"
            )


def resolve_rows(arch: Architecture, rows: Sequence[GraftRow], donors) -> list[ResolvedGraft]:
    """Resolve every row's spec on ``arch``; a SpecError if one uses a donor not in ``donors``."""
    resolved = [
        r.spec.resolve(arch, len(r.input_ids), {k: list(v) for k, v in r.spans.items()})
        for r in rows
    ]
    for res in resolved:
        missing = res.donors() - set(donors)
        if missing:
            raise SpecError(
                f"the graft uses donor(s) {sorted(missing)} but only {sorted(donors)} were given"
            )
    return resolved


def run_grafts(
    base,
    donors: Mapping[str, nn.Module] | nn.Module,
    rows: Sequence[GraftRow],
    *,
    batch_size: int = 16,
    padding_side: str = "left",
    pad_id: int | None = None,
    log_probs: bool = False,
    remote: bool | str = False,
    backend=None,
    progress: bool | str = False,
    sort_by_length: bool = True,
) -> torch.Tensor:
    """Final-position logits of every (prompt, graft) row, batched, one trace per batch.

    Args:
        base: the pretrained model (HF causal LM, its nnsight wrapper, or a
            :class:`graft.models.LoadedModel`).
        donors: ``{name: model}`` (a bare model means ``{"sft": model}``; models may be
            ``LoadedModel`` objects).
        rows: ``GraftRow``s; each has its own prompt, spans and spec.
        batch_size: rows per forward pass.
        padding_side: ``"left"`` (only the last position's logits are computed) or ``"right"``.
        pad_id: id used for padding (masked out; default: the config's pad/eos id or 0).
        log_probs: return log-softmax instead of logits.
        remote: passed to nnsight's ``trace`` (``"local"`` runs the remote serialisation path
            in-process).
        backend: an nnsight backend (e.g. ``RemoteBackend``) passed to ``trace``.
        progress: show a tqdm bar (a string is used as its description).
        sort_by_length: batch rows of similar length together (results keep input order).

    Returns:
        tensor [len(rows), vocab] on CPU: float32 (float64 if the model is float64).
    """
    base = _model_of(base)
    donors = as_donors(donors)
    torch_base = _unwrap(base)
    arch = architecture_of(torch_base)
    _check_lengths(torch_base, rows)
    for name, donor in donors.items():
        check_compatible(torch_base, _unwrap(donor), name)
    if pad_id is None:
        pad_id = default_pad_id(torch_base.config)
    resolved = resolve_rows(arch, rows, donors)  # bad specs fail before any compute
    order = list(range(len(rows)))
    if sort_by_length:
        order.sort(key=lambda i: len(rows[i].input_ids))
    out: torch.Tensor | None = None
    n_batches = math.ceil(len(rows) / batch_size) if rows else 0
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(
            total=len(rows), desc=progress if isinstance(progress, str) else "grafting", unit="row"
        )
    for b in range(n_batches):
        idx = order[b * batch_size : (b + 1) * batch_size]
        plan = plan_batch(
            arch,
            [rows[i] for i in idx],
            pad_id=pad_id,
            padding_side=padding_side,
            resolved=[resolved[i] for i in idx],
        )
        logits = run_plan(base, donors, plan, remote=remote, backend=backend)
        if out is None:
            out = torch.empty((len(rows), logits.shape[-1]), dtype=logits.dtype)
        out[torch.tensor(idx)] = logits
        if bar is not None:
            bar.update(len(idx))
    if bar is not None:
        bar.close()
    if out is None:
        return torch.empty((0, 0))
    return torch.log_softmax(out, dim=-1) if log_probs else out


def _listed(items) -> list | None:
    """``list(items)``, or ``None`` for something that is not iterable."""
    try:
        return list(items)
    except TypeError:
        return None


def _text_list(texts: Sequence[str] | str) -> list[str]:
    texts = [texts] if isinstance(texts, str) else _listed(texts)
    if not texts or not all(isinstance(t, str) for t in texts):
        raise SpecError("texts must be a prompt string or a non-empty list of prompt strings")
    return texts


def _spec_list(specs: Sequence[GraftSpec | str] | GraftSpec | str) -> list[GraftSpec]:
    specs = [specs] if isinstance(specs, str | GraftSpec) else _listed(specs)
    if not specs or not all(isinstance(s, str | GraftSpec) for s in specs):
        raise SpecError("specs must be a spec (string or GraftSpec) or a non-empty list of them")
    return [GraftSpec.parse(s) if isinstance(s, str) else s for s in specs]


def _field_list(fields, texts: list[str]) -> list[Mapping[str, str]]:
    if fields is None:
        return [{} for _ in texts]
    if isinstance(fields, Mapping):
        if len(texts) != 1:
            raise SpecError(
                f"fields: one {{name: substring}} dict per text, i.e. a list of {len(texts)} "
                "dicts (a single dict only goes with a single text)"
            )
        return [fields]
    fields = _listed(fields)
    if (
        fields is None
        or len(fields) != len(texts)
        or not all(isinstance(f, Mapping) for f in fields)
    ):
        raise SpecError(
            f"fields: one {{name: substring}} dict per text, i.e. a list of {len(texts)} dicts"
        )
    return fields


def _char_spans(text: str, named: Mapping[str, str]) -> dict[str, tuple[int, int]]:
    chars = {}
    for name, value in named.items():
        start = text.find(value) if isinstance(value, str) and value else -1
        if start < 0:
            raise SpecError(f"field {name!r}: {value!r} does not occur in the prompt {text!r}")
        chars[name] = (start, start + len(value))
    return chars


def graft_texts(
    base,
    donors: Mapping[str, nn.Module] | nn.Module | LoadedModel,
    tokenizer,
    texts: Sequence[str] | str,
    specs: Sequence[GraftSpec | str] | GraftSpec | str,
    *,
    fields: Sequence[Mapping[str, str]] | Mapping[str, str] | None = None,
    **kwargs,
) -> torch.Tensor:
    """Notebook entry point: graft every spec on every text; final-position logits.

    Args:
        base: the pretrained HF causal LM, or a :class:`graft.models.LoadedModel`.
        donors: ``{name: model}`` or one donor model (named ``"sft"``); models may be
            ``LoadedModel`` objects.
        tokenizer: the models' tokenizer (a fast one gives exact character offsets);
            ``None`` takes the tokenizer of a ``LoadedModel`` base.
        texts: a prompt, or a list of prompts.
        specs: a graft spec, or a list of them (objects or text forms such as
            ``"FE+LT:all:all"``).
        fields: per text, span name -> substring of the text, e.g. ``{"FE": "Keanu Reeves"}``;
            its first occurrence becomes the span of that name. One dict per text; a single
            dict is accepted with a single text.
        **kwargs: passed to ``run_grafts`` (batch_size, padding_side, log_probs, ...).

    Returns:
        logits ``[texts, specs, vocab]`` for lists; a single text (a ``str``) drops the texts
        dimension and a single spec (a ``str`` or ``GraftSpec``) the specs dimension, so one
        text and one spec give ``[vocab]``.
    """
    from graft.core.spans import tokenize_with_spans

    if tokenizer is None:
        if not isinstance(base, LoadedModel):
            raise SpecError("pass the models' tokenizer (or a LoadedModel as base)")
        tokenizer = base.tokenizer
    text_list, spec_list = _text_list(texts), _spec_list(specs)
    rows = []
    for text, named in zip(text_list, _field_list(fields, text_list), strict=True):
        prompt = tokenize_with_spans(tokenizer, text, _char_spans(text, named))
        if prompt.missing:
            raise SpecError(f"fields {prompt.missing} of {text!r} map to no token")
        rows += [GraftRow(prompt.input_ids, prompt.spans, spec) for spec in spec_list]
    kwargs.setdefault("pad_id", getattr(tokenizer, "pad_token_id", None))
    logits = run_grafts(base, donors, rows, **kwargs)
    logits = logits.view(len(text_list), len(spec_list), -1)
    if isinstance(specs, str | GraftSpec):
        logits = logits[:, 0]
    return logits[0] if isinstance(texts, str) else logits
