"""Activation and residual-stream patching of a graft's cells, beside weight grafting.

A graft spec names cells: (position, layer, component), plus the head and the embeddings.
graft's engine *grafts weights* there: each grafted module's output at the spec's positions
is the donor's module run on the input the base's run gave it. Activation patching, as
nnsight, TransformerLens or pyvene users do it, takes the outputs from the donor's own run
instead. :class:`PatchingExecutor` runs the same batch plans (:class:`graft.core.plan.
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
- ``weights``: the engine itself (``None`` executor: :class:`graft.core.executor.LocalExecutor`).

A plan that patches nothing is the base's own forward (the engine's path for such a plan),
so patching nothing equals the base bit for bit.
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nnsight
import polars as pl
import torch
from torch import nn

from graft.core.arch import architecture_of
from graft.core.executor import LocalExecutor, _plain_forward
from graft.core.plan import BatchPlan
from graft.core.trace import last_logits, merge_slices, model_device, row_metrics, trace_batch
from graft.core.wrapping import unwrap, wrap
from graft.errors import SpecError
from graft.results.compare import read_examples, replicate_column
from graft.results.folder import RunFolder
from graft.results.plots.bars import component_chart
from graft.results.plots.style import save_figure, whiskers_text
from graft.results.stats import paired_contrasts
from graft.results.summary import summarize
from graft.study.grafts import Graft, component_grafts, position_grafts

#: The ways a graft's cells are given the donor's values, in report order.
METHODS = ("weights", "activation", "residual")

Site = types.SimpleNamespace  # a patch as graft.core.trace.trace_batch makes it


def check_methods(methods: Sequence[str]) -> list[str]:
    """``methods`` checked against :data:`METHODS` (order kept, repeats dropped)."""
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise SpecError(f"unknown patching method(s) {bad}; use some of {', '.join(METHODS)}")
    return list(dict.fromkeys(methods))


def executor_for(method: str) -> PatchingExecutor | None:
    """The executor of ``method``: None (the engine's own) for ``weights``."""
    check_methods([method])
    return None if method == "weights" else PatchingExecutor(method)


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


def donor_outputs(
    donors: Mapping[str, nn.Module | None], sites: Sequence[Site], inputs: Mapping[str, Any]
) -> dict[tuple[str, str], torch.Tensor]:
    """``{(donor, path): the donor's own output of that module}`` on ``inputs``: one nnsight
    trace per donor, saving its sites' outputs in forward order."""
    saved: dict[tuple[str, str], torch.Tensor] = {}
    for name in dict.fromkeys(s.donor for s in sites):
        donor = donors.get(name)
        if donor is None:
            raise SpecError(
                f"the graft uses donor {name!r} but its weights were not given; pass the "
                "model in donors={...}"
            )
        paths = list(dict.fromkeys(s.path for s in sites if s.donor == name))
        model = wrap(donor)
        with torch.no_grad(), model.trace(**inputs):
            for path in paths:
                saved[(name, path)] = nnsight.save(_stream(model.get(path).output))
    return saved


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
            new, donor = out, saved[(site.donor, site.path)].to(out.device, out.dtype)
            if site.seq_dim != 1:
                new, donor = new.transpose(1, site.seq_dim), donor.transpose(1, site.seq_dim)
            rows = site.rows.to(new.device)
            if rows.shape[1] != new.shape[1]:  # the head under logits_to_keep: last position
                rows = rows[:, rows.shape[1] - new.shape[1] :]
            if site.fused and site.slices:
                slices = [(k, m.to(new.device)) for k, m in site.slices]
                new[rows] = merge_slices(new[rows], donor[rows], site.fused, slices, site.n_heads)
            else:
                new[rows] = donor[rows]
        env.output = value
        start = end


class PatchingExecutor(LocalExecutor):
    """Runs planned batches by activation or residual-stream patching (module docstring):
    every row on the base, its whole prompt, no shortcuts; a donor's own run first.

    Args:
        method: ``activation`` or ``residual``.
    """

    def __init__(self, method: str) -> None:
        super().__init__(shortcuts=False)
        if method not in METHODS[1:]:
            raise SpecError(f"patching method {method!r}: use activation or residual")
        self.method = method

    def run(
        self, base, donors: Mapping[str, nn.Module | None], plans: Iterable[BatchPlan]
    ) -> Iterator[torch.Tensor]:
        for plan in plans:
            yield self.run_plan(base, donors, plan)

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
        saved = donor_outputs(donors, sites, batch.inputs)
        model = wrap(base)
        with torch.no_grad(), model.trace(**batch.inputs):
            write_outputs(model, sites, saved)
            picked = last_logits(model.output.logits, batch)
            if batch.targets is not None:
                picked = row_metrics(picked, batch.targets, batch.top_k)
            result = nnsight.save(picked)
        return result


# ---------------------------------------------------------------- the experiment's report

#: The figures of :func:`write_report`: summary statistic -> file stem.
FIGURE_METRICS = {
    "acc@5": "patching_acc5",
    "mean_rank": "patching_rank",
    "mean_name_logprob": "patching_name_logprob",
}
#: Cells that are one model under every method: the base (nothing patched) and the donor.
REFERENCES = ("PRE", "SFT")
#: A prompt within a run: templates share prompt ids.
EXAMPLE_KEY = ("template", "prompt_id")


def patching_grafts(
    positions: Sequence[str],
    layers: str = "q4",
    head_policy: str = "base",
    fe: str | None = None,
    protocol: str = "graft",
) -> list[Graft]:
    """The cells compared: E1's position grafts (every component of every layer at each
    position set, PRE and SFT) and E3's component sets at the last token over ``layers``
    (``fe``: with the first entity grafted too), as :func:`position_grafts` and
    :func:`component_grafts` name them under ``protocol``."""
    grafts = position_grafts(positions, head_policy, protocol=protocol)
    names = {g.name for g in grafts}
    sets = component_grafts(layers, head_policy, fe=fe, protocol=protocol)
    return grafts + [g for g in sets if g.name not in names]


def method_examples(root: str | Path, methods: Sequence[str]) -> pl.DataFrame:
    """Every method's ``examples.parquet`` (``<root>/<method>``), one table: ``cell`` (the
    graft's name), ``method``, and ``graft`` = ``"<cell> [<method>]"``, what is compared."""
    frames = []
    for method in methods:
        examples = read_examples(Path(root) / method)
        frames.append(
            examples.with_columns(
                pl.col("graft").alias("cell"),
                pl.lit(method).alias("method"),
                (pl.col("graft") + f" [{method}]").alias("graft"),
            )
        )
    return pl.concat(frames, how="diagonal_relaxed")


def method_contrasts(
    examples: pl.DataFrame,
    methods: Sequence[str],
    hit: str = "hit@5",
    score: str = "name_logprob",
    n_boot: int = 1000,
    seed: int = 0,
    references: Sequence[str] = REFERENCES,
) -> pl.DataFrame:
    """Each cell's methods against each other, prompt by prompt over every template
    (:func:`graft.results.stats.paired_contrasts`: exact McNemar and Newcombe's paired
    interval for ``hit``, a paired bootstrap for ``score``, Holm over the whole table), with
    ``cell``, ``method_a`` and ``method_b`` columns in front. The ``references`` (the base
    alone, the whole donor: the same model under every method) are left out of the table
    and of its Holm families."""
    cells = [c for c in dict.fromkeys(examples["cell"].to_list()) if c not in references]
    meth = [m for m in METHODS if m in methods]
    pairs = [
        (f"{c} [{b}]", f"{c} [{a}]") for c in cells for a, b in itertools.combinations(meth, 2)
    ]
    examples, seed_col = replicate_column(examples)
    table = paired_contrasts(
        examples,
        pairs,
        hit=hit,
        score=score,
        by=[],
        example_key=EXAMPLE_KEY,
        seed_col=seed_col,
        n_boot=n_boot,
        seed=seed,
    )
    if table.is_empty():
        return table
    method = r"\[(\w+)\]$"
    return table.select(
        pl.col("graft_a").str.replace(r" \[\w+\]$", "").alias("cell"),
        pl.col("graft_a").str.extract(method).alias("method_a"),
        pl.col("graft_b").str.extract(method).alias("method_b"),
        pl.all(),
    )


@dataclass
class PatchingReport:
    """What :func:`write_report` wrote.

    Args:
        summary: per cell and method, the run summaries' statistics.
        contrasts: per cell, each pair of methods (McNemar on top-5 hits, bootstrap on the
            whole name's log-prob), as ``contrasts_name_logprob`` holds it.
        figures: the PNG paths.
    """

    summary: pl.DataFrame
    contrasts: pl.DataFrame
    figures: list[Path]


def write_report(
    root: str | Path,
    methods: Sequence[str],
    model: str,
    n_boot: int = 1000,
    seed: int = 0,
) -> PatchingReport:
    """Summaries, contrasts and figures of a patching run whose methods ran into
    ``<root>/<method>``: ``summary`` (per cell and method), ``contrasts_name_logprob``
    (McNemar on top-5 hits, bootstrap on the whole name's log-prob), ``contrasts_rank``
    (bootstrap on the first token's rank), each ``.parquet`` and ``.csv``, and one figure per
    :data:`FIGURE_METRICS` entry under ``<root>/figures`` (one panel per cell, one bar per
    method, 95% intervals)."""
    folder = RunFolder(root)
    examples = method_examples(root, methods)
    summary = summarize(examples, by=("cell", "method"), n_boot=n_boot, seed=seed)
    folder.mark()
    folder.write_summary(summary)
    scores = {"contrasts_rank": "target_rank", "contrasts_name_logprob": "name_logprob"}
    table = pl.DataFrame()
    for stem, score in scores.items():
        if score in examples.columns:
            table = method_contrasts(examples, methods, score=score, n_boot=n_boot, seed=seed)
            folder.write_summary(table, stem=stem)
    config = {"experiment": "patching", "model": model, "methods": list(methods)}
    folder.write_json("config.json", config)
    pngs = []
    for metric, stem in FIGURE_METRICS.items():
        if metric not in summary.columns:
            continue
        fig = component_chart(
            summary,
            metric,
            x="method",
            group="cell",
            order=[m for m in METHODS if m in methods],
            reference_labels=(),
            model=model,
            title=f"weights vs activation vs residual patching ({model})",
            legend_labels={"graft": "method"},
            whiskers=whiskers_text(summary, metric),
        )
        pngs.append(save_figure(fig, folder.path / "figures", stem)[0])
    return PatchingReport(summary, table, pngs)
