"""Activation and residual-stream patching of a graft's cells, beside weight grafting.

A graft spec names cells: (position, layer, component), plus the head and the embeddings.
graft's engine *grafts weights* there: each grafted module's output at the spec's positions
is the donor's module run on the input the base's run gave it. Activation patching, as
nnsight, TransformerLens or pyvene users do it, takes the outputs from the donor's own run
instead. :class:`PatchingExecutor` runs the same batch plans (:class:`graft.core.planning.plan.
BatchPlan`: per grafted module, a bool [batch, positions] mask, in forward order) that way:

- ``activation``: the donor runs the batch alone, in an nnsight trace that saves the output
  of every module the plan grafts; then the base runs it in a trace that writes the donor's
  saved outputs into those modules' outputs at the plan's masks, in forward order (fused
  q/k/v slices merged as the engine merges them). Leaf modules are the unit: the embedding,
  each q/k/v/o/norm/gate/up/down module of a layer the spec grafts, the final norm and the
  unembedding where the head policy takes the donor's.
- ``residual``: per decoder layer, the positions where the plan grafts any module of that
  layer; the layer's output (the residual stream after it) is replaced there by the donor's.
  Embedding and head patches stay activation patches (the embedding output is the residual
  stream before layer 0; the final norm and the unembedding act on the stream after the
  last layer). Several component sets of one layer range therefore patch the same stream.
- ``weights``: the engine itself (``None`` executor:
  :class:`graft.core.execution.executor.LocalExecutor`).

A plan that patches nothing is the base's own forward (the engine's path for such a plan),
so patching nothing equals the base bit for bit.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

import nnsight
import torch
from torch import nn

from graft.core.execution import resume, windows
from graft.core.execution.executor import LocalExecutor, _plain_forward
from graft.core.execution.trace import (
    last_logits,
    merge_slices,
    model_device,
    row_metrics,
    trace_batch,
)
from graft.core.families.arch import architecture_of, family_of
from graft.core.families.wrapping import unwrap, wrap
from graft.core.planning.plan import BatchPlan
from graft.errors import SpecError

#: The ways a graft's cells are given the donor's values, in report order.
METHODS = ("weights", "activation", "residual")

Site = types.SimpleNamespace  # a patch as graft.core.execution.trace.trace_batch makes it


def check_methods(methods: Sequence[str]) -> list[str]:
    """``methods`` checked against :data:`METHODS` (order kept, repeats dropped)."""
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise SpecError(f"unknown patching method(s) {bad}; use some of {', '.join(METHODS)}")
    return list(dict.fromkeys(methods))


def executor_for(method: str, reuse: bool = True) -> LocalExecutor | None:
    """The executor of ``method``: the engine's own for ``weights`` (None without
    ``reuse``). ``reuse``: each row runs from its first changed layer on, the layers below it
    once per distinct prompt (:mod:`graft.core.execution.resume`); False: every row its
    whole forward (the one-cell path)."""
    check_methods([method])
    if method == "weights":
        return LocalExecutor(resume_layers=True) if reuse else None
    return PatchingExecutor(method, reuse=reuse)


def residual_sites(layers_path: str, patches: Sequence[Site]) -> list[Site]:
    """The plan's ``patches`` as residual-stream sites: one per (decoder layer, donor), at
    the layer's output, on the positions where any of its modules is patched; patches
    outside the layers (embeddings, final norm, unembedding) as they are. Forward order is
    kept (a layer's site stands where its first module's patch stood)."""
    prefix = layers_path + "."
    out: list[Site] = []
    layer_sites: dict[tuple[str, str], Site] = {}
    for p in patches:
        if not p.path.startswith(prefix):
            out.append(p)
            continue
        path = prefix + p.path[len(prefix) :].split(".")[0]
        site = layer_sites.get((p.donor, path))
        if site is None:
            for other in (s for (d, q), s in layer_sites.items() if q == path and d != p.donor):
                if bool((other.rows & p.rows).any()):
                    raise SpecError(
                        f"donors {other.donor!r} and {p.donor!r} both graft {path} at one "
                        "position: residual patching takes one donor per (layer, position)"
                    )
            site = types.SimpleNamespace(
                path=path, donor=p.donor, rows=p.rows.clone(), fused=None, slices=[], seq_dim=1
            )
            layer_sites[(p.donor, path)] = site
            out.append(site)
        else:
            site.rows = site.rows | p.rows
    return out


def _stream(value: Any) -> torch.Tensor:
    """A module's output tensor (a decoder layer may return a tuple whose first item it is)."""
    return value[0] if isinstance(value, tuple) else value


def unique_rows(inputs: Mapping[str, Any]) -> tuple[dict[str, Any], torch.Tensor]:
    """``inputs`` with each distinct padded row once, and each original row's index among
    them. A run's batches hold many grafts of one prompt (rows are sorted by prompt), and a
    donor's own run does not depend on the graft: it runs once per prompt."""
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    key = torch.cat([ids, mask, inputs.get("position_ids", mask)], dim=1)
    unique, inverse = torch.unique(key, dim=0, return_inverse=True)
    first = torch.full((unique.shape[0],), key.shape[0], dtype=torch.long)
    first = first.scatter_reduce(0, inverse, torch.arange(key.shape[0]), reduce="amin")
    batch = ids.shape[0]
    picked = {
        k: v[first] if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == batch else v
        for k, v in inputs.items()
    }
    return picked, inverse


def _given_donor(donors: Mapping[str, nn.Module | None], name: str) -> nn.Module:
    """The donor ``name`` of ``donors``; its weights not given: a one-line error."""
    donor = donors.get(name)
    if donor is None:
        raise SpecError(
            f"the graft uses donor {name!r} but its weights were not given; pass the "
            "model in donors={...}"
        )
    return donor


def donor_outputs(
    donors: Mapping[str, nn.Module | None], sites: Sequence[Site], inputs: Mapping[str, Any]
) -> dict[tuple[str, str], torch.Tensor]:
    """``{(donor, path): the donor's own output of that module}`` on ``inputs``: one nnsight
    trace per donor over the batch's distinct rows (:func:`unique_rows`), saving its sites'
    outputs in forward order; each output is then laid out row for row as ``inputs``."""
    saved: dict[tuple[str, str], torch.Tensor] = {}
    distinct, inverse = unique_rows(inputs)
    for name in dict.fromkeys(s.donor for s in sites):
        donor = _given_donor(donors, name)
        paths = list(dict.fromkeys(s.path for s in sites if s.donor == name))
        model = wrap(donor)
        with torch.no_grad(), model.trace(**distinct):
            for path in paths:
                saved[(name, path)] = nnsight.save(_stream(model.get(path).output))
    return {k: v[inverse.to(v.device)] for k, v in saved.items()}


def write_site(out: torch.Tensor, site: Site, donor: torch.Tensor) -> None:
    """The donor's saved output ``donor`` written into a module's output ``out`` at
    ``site``'s mask, in place (fused q/k/v slices merged as the engine merges them). ``out``
    may hold more rows than the mask (a resumed batch's last layer): its first ones are the
    mask's."""
    donor = donor.to(out.device, out.dtype)
    new = out[: site.rows.shape[0]]
    if site.seq_dim != 1:
        new, donor = new.transpose(1, site.seq_dim), donor.transpose(1, site.seq_dim)
    if donor.shape[1] != new.shape[1]:  # a one-token step: the donor's last positions
        donor = donor[:, donor.shape[1] - new.shape[1] :]
    rows = site.rows.to(new.device)
    if rows.shape[1] != new.shape[1]:  # the head under logits_to_keep: last position
        rows = rows[:, rows.shape[1] - new.shape[1] :]
    if site.fused and site.slices:
        slices = [(k, m.to(new.device)) for k, m in site.slices]
        new[rows] = merge_slices(new[rows], donor[rows], site.fused, slices, site.n_heads)
    else:
        new[rows] = donor[rows]


def write_outputs(
    model: Any, sites: Sequence[Site], saved: Mapping[tuple[str, str], torch.Tensor]
) -> None:
    """Inside an open trace of the base: at each site (forward order), the donor's saved
    output written into the module's output at the site's mask, in place."""
    start = 0
    while start < len(sites):
        end = start + 1
        while end < len(sites) and sites[end].path == sites[start].path:
            end += 1
        env = model.get(sites[start].path)
        value = env.output
        out = _stream(value)
        for site in sites[start:end]:
            write_site(out, site, saved[(site.donor, site.path)])
        env.output = value
        start = end


def donor_outputs_plain(
    donors: Mapping[str, nn.Module | None], sites: Sequence[Site], inputs: Mapping[str, Any]
) -> dict[tuple[str, str], torch.Tensor]:
    """``{(donor, path): the donor's own output of that module}`` on ``inputs`` (rows as
    given: a resumed batch's distinct prompts), one plain forward per donor with a forward
    hook at each site: what :func:`donor_outputs` saves, without a trace."""
    saved: dict[tuple[str, str], torch.Tensor] = {}
    for name in dict.fromkeys(s.donor for s in sites):
        donor = _given_donor(donors, name)
        model = unwrap(donor)
        handles = []
        for path in dict.fromkeys(s.path for s in sites if s.donor == name):

            def keep(module: nn.Module, args: Any, out: Any, key=(name, path)) -> None:
                saved[key] = _stream(out)

            handles.append(model.get_submodule(path).register_forward_hook(keep))
        try:
            with torch.no_grad():
                model(**{**inputs, "use_cache": False})
        finally:
            for handle in handles:
                handle.remove()
    return saved


@contextlib.contextmanager
def writing(
    model: nn.Module,
    sites: Sequence[Site],
    saved: Mapping[tuple[str, str], torch.Tensor],
    expand: torch.Tensor,
) -> Iterator[None]:
    """Within the block, a forward of ``model`` writes at each site the donor's saved output
    (``saved``: of the distinct prompts; ``expand``: each row's distinct prompt, the site's
    rows the first ones), in place, by a forward hook at each site's module."""
    by_path: dict[str, list[Site]] = {}
    for site in sites:
        by_path.setdefault(site.path, []).append(site)

    def hook_for(group: list[Site]) -> Any:
        def hook(module: nn.Module, args: Any, value: Any) -> Any:
            out = _stream(value)
            for site in group:
                rows = expand[: site.rows.shape[0]].to(out.device)
                write_site(out, site, saved[(site.donor, site.path)].index_select(0, rows))
            return value

        return hook

    handles = [
        model.get_submodule(path).register_forward_hook(hook_for(group))
        for path, group in by_path.items()
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class PatchingExecutor(LocalExecutor):
    """Runs planned batches by activation or residual-stream patching (module docstring):
    every row on the base, its whole prompt, no shortcuts; a donor's own run first.

    Args:
        method: ``activation`` or ``residual``.
    """

    def __init__(self, method: str, reuse: bool = True) -> None:
        super().__init__(shortcuts=False)
        if method not in METHODS[1:]:
            raise SpecError(f"patching method {method!r}: use activation or residual")
        self.method = method
        self.reuse = reuse

    def run(
        self, base, donors: Mapping[str, nn.Module | None], plans: Iterable[BatchPlan]
    ) -> Iterator[torch.Tensor]:
        try:
            for plan in plans:
                yield self.run_plan(base, donors, plan)
        finally:
            self.prompt_values().clear()

    def run_plan(self, base, donors: Mapping[str, nn.Module | None], plan: BatchPlan):
        """Logits [batch, vocab] at each row's last token (per-row metrics for a plan with
        targets), on the base's device."""
        torch_model = unwrap(base)
        batch = trace_batch(plan, torch_model, model_device(torch_model))
        if not plan.patches:  # nothing patched: the base's own forward, as the engine's
            return _plain_forward(torch_model, batch)
        sites = batch.patches
        if self.method == "residual":
            sites = residual_sites(architecture_of(torch_model).table.layers_path, sites)
        if self.reuse:
            return self._resumed_patch(torch_model, donors, batch, sites)
        saved = donor_outputs(donors, sites, batch.inputs)
        model = wrap(base)
        with torch.no_grad(), model.trace(**batch.inputs):
            write_outputs(model, sites, saved)
            picked = last_logits(model.output.logits, batch)
            if batch.targets is not None:
                picked = row_metrics(picked, batch.targets, batch.top_k)
            result = nnsight.save(picked)
        return result

    def _resumed_patch(
        self,
        torch_model: nn.Module,
        donors: Mapping[str, nn.Module | None],
        batch: types.SimpleNamespace,
        sites: list[Site],
    ) -> torch.Tensor:
        """``batch`` patched at ``sites``, each row run from its first patched layer and
        column on (:func:`graft.core.execution.windows.run_resumed`), the donors' site
        outputs computed once per distinct prompt without a trace."""
        batch.patches = sites
        family = family_of(torch_model)
        layers = list(cast(nn.ModuleList, torch_model.get_submodule(family.layers_path)))
        where = (family.layers_path, (family.final_norm_path, family.unembed_path))

        def forward(run: types.SimpleNamespace, ready: resume.Resumed | None) -> torch.Tensor:
            assert ready is not None  # forced: every row resumed
            saved = self._donor_values(donors, run.patches, ready.distinct)
            with torch.no_grad(), writing(torch_model, run.patches, saved, ready.expand):
                picked = last_logits(torch_model(**run.inputs).logits, run)
            return self._scored(picked, run)

        values = self.prompt_values()
        result = windows.run_resumed(batch, torch_model, layers, where, values, forward, True)
        assert result is not None  # forced
        return result

    def _donor_values(
        self,
        donors: Mapping[str, nn.Module | None],
        sites: Sequence[Site],
        distinct: dict[str, Any],
    ) -> dict[tuple[str, str], torch.Tensor]:
        """:func:`donor_outputs_plain` of ``sites`` on ``distinct``'s prompts, each prompt's
        output of each site computed once per run."""
        keys = list(dict.fromkeys((s.donor, s.path) for s in sites))
        tags = [("donor output", name, id(donors.get(name)), path) for name, path in keys]

        def compute(part: dict[str, Any], asked: list[Any]) -> list[torch.Tensor]:
            ask = [types.SimpleNamespace(donor=t[1], path=t[3]) for t in asked]
            found = donor_outputs_plain(donors, ask, part)
            return [found[(a.donor, a.path)] for a in ask]

        values = self.prompt_values().get(tags, distinct, compute)
        return dict(zip(keys, values, strict=True))

    @staticmethod
    def _scored(picked: torch.Tensor, batch: types.SimpleNamespace) -> torch.Tensor:
        """Each row's logits, or with ``batch.targets`` its metrics."""
        if batch.targets is None:
            return picked
        return row_metrics(picked, batch.targets, batch.top_k)
