"""The logit lens under grafts: every layer's residual stream at the last token (``LT``) and at
the first entity's last token (``FE-last``), decoded through the graft's readout (its final
norm and unembedding), scored on the row's target token as the run scores its logits.

:func:`logit_lens` does it for engine rows: one nnsight trace per batch
(:func:`graft.core.grafted_trace.trace_rows`, the engine's own trace code, so a grafted row's
layers are exactly the graft's), every layer's output saved at the two positions only, the
trace stopped after the last layer; each saved state then goes through the readout, two
positions per row and layer, never a vocabulary of logits for every position. A reference
that is a whole donor with its own head (``SFT``) is that donor's own run (a trace of the
donor, nothing grafted), as the engine routes it; ``none`` (``PRE``) is the base's.

:func:`run_lens` adds the lens to a finished experiment run: the same rows in the same stored
batches, stored as ``parts/lens/<batch>.parquet`` (resumable as the run's own batches are),
combined into ``lens.parquet`` and summarised per (group, template, graft, position, layer)
into ``lens_summary.parquet`` and ``.csv`` with :func:`graft.results.summary.summarize`
(means, medians and their bootstrap intervals over prompts). :func:`draw_lens_figures` draws
them (:func:`graft.results.plots.lens.lens_chart`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import nnsight
import polars as pl
import torch
from torch import nn
from tqdm.auto import tqdm

from graft.core.arch import architecture_of
from graft.core.grafted_trace import trace_rows
from graft.core.plan import GraftRow
from graft.core.spec import GraftSpec, parse_spec
from graft.core.wrapping import unwrap
from graft.errors import ExperimentError
from graft.models import context_length
from graft.results.folder import RunFolder
from graft.results.locks import exclusive
from graft.results.plots import save_figure
from graft.results.plots.lens import lens_chart
from graft.results.summary import summarize
from graft.results.tables import read_table
from graft.study.config import ExperimentConfig
from graft.study.grafts import Graft
from graft.study.prompts import TestExample
from graft.study.rows import graft_rows, load_examples, plan_rows, sample_examples
from graft.study.run_inputs import RunPaths, load_run_models
from graft.study.workspace import Workspace

logger = logging.getLogger(__name__)

#: The table of per-(row, layer, position) scores, and the stem of its summary.
LENS_TABLE = "lens"
LENS_SUMMARY = "lens_summary"
#: The positions the lens reads: the last token, and the last token of the first entity.
POSITIONS = ("LT", "FE-last")
#: The columns one summary row is grouped by.
LENS_BY = ("group", "template", "graft", "position", "layer")
#: The summary statistics drawn, each in a figure of its own.
FIGURE_METRICS = ("median_rank", "mean_prob")

_NOTHING = parse_spec("none")


@dataclass
class LensScores:
    """The lens of some rows.

    Args:
        target_rank: ``[rows, layers, positions]`` the target's rank (0 = top; the count of
            tokens with a strictly greater logit, as :func:`graft.results.metrics.
            example_metrics` counts it).
        target_logprob: ``[rows, layers, positions]`` its log-probability (float32
            log-softmax).
        has_position: ``[rows, positions]`` whether the row has the position (a prompt
            without an ``FE`` span has no ``FE-last``; its entries are 0 and not stored).
    """

    target_rank: torch.Tensor
    target_logprob: torch.Tensor
    has_position: torch.Tensor


def own_model(spec: GraftSpec) -> str | None:
    """The donor a spec is whole, with its own head (``ALL:all:all@d; head=donor@d``, the
    ``SFT`` reference), else None: such a row is that donor's own run."""
    if len(spec.rules) != 1 or spec.head != "donor" or spec.protocol != "graft":
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
) -> LensScores:
    """The logit lens of ``rows`` (one batch): each layer's output at ``LT`` and ``FE-last``
    decoded through the row's readout and scored on its target token.

    The readout is the graft's: the final norm and unembedding its head policy gives the last
    position (the base's, or a donor's with ``head=donor``), used at both positions; a whole
    donor with its own head runs as that donor and reads out with its own.

    Args:
        base: the base model (a Hugging Face causal LM).
        donors: donor name -> model, as the rows' specs name them.
        rows: the engine rows (token ids, token spans, spec).
        targets: each row's target token id.
        pad_id: the padding id (default: the base config's).
    """
    if len(targets) != len(rows):
        raise ExperimentError(f"{len(targets)} targets for {len(rows)} rows")
    n_layers = architecture_of(unwrap(base)).n_layers
    shape = (len(rows), n_layers, len(POSITIONS))
    rank = torch.zeros(shape, dtype=torch.long)
    logprob = torch.zeros(shape, dtype=torch.float32)
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
            r, lp = _decode(states[part], norm, unembed, ids, _softcap(model))
            rank[[idx[j] for j in part]] = r
            logprob[[idx[j] for j in part]] = lp
    return LensScores(rank, logprob, has)


def _layer_states(
    model: nn.Module, donors: Mapping[str, nn.Module], rows: list[GraftRow], pad_id: int | None
) -> torch.Tensor:
    """``[rows, layers, positions, hidden]``: every layer's output at ``LT`` and ``FE-last``
    in the grafted trace (a row without ``FE`` repeats ``LT``), the trace stopped after the
    last layer (no head over every position)."""
    arch = architecture_of(unwrap(model))
    paths = [f"{arch.table.layers_path}.{i}" for i in range(arch.n_layers)]
    g = trace_rows(model, donors, rows, pad_id=pad_id)
    pos = torch.tensor([[s["LT"][0], s.get("FE", s["LT"])[-1]] for s in g.spans])
    which = torch.arange(len(rows))[:, None]
    with g:
        saved = nnsight.save([_at(g.model.get(p).output, which, pos) for p in paths])
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank and log-probability of ``targets`` [rows] under the readout of ``states``
    [rows, layers, positions, hidden], one layer at a time (rows x positions logits each)."""
    ranks, logprobs = [], []
    for layer in range(states.shape[1]):
        logits = unembed(norm(states[:, layer])).to("cpu", torch.float32)  # [rows, pos, V]
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        index = targets[:, None, None].expand(-1, logits.shape[1], 1)
        target_logit = logits.gather(-1, index)
        ranks.append((logits > target_logit).sum(-1))
        logprobs.append(torch.log_softmax(logits, dim=-1).gather(-1, index).squeeze(-1))
    return torch.stack(ranks, dim=1), torch.stack(logprobs, dim=1)


# ----------------------------------------------------------------------- in a run folder


def check_lens_config(cfg: ExperimentConfig) -> None:
    """Refuse what the lens does not run: several replicates, and remote runs."""
    if cfg.replicated:
        raise ExperimentError(
            "the lens runs one replicate: drop finetune_seeds, data_seeds and control",
            param="finetune_seeds",
        )
    if cfg.remote is not None:
        raise ExperimentError(
            "the lens runs on this machine only: leave remote unset", param="remote"
        )


def lens_frame(
    scores: LensScores,
    chunk: Sequence[tuple[int, int]],
    examples: Sequence[TestExample],
    grafts: Sequence[Graft],
    cfg: ExperimentConfig,
) -> pl.DataFrame:
    """One stored batch of the lens table: a row per (example, graft, layer, position)."""
    n_rows, n_layers, n_pos = scores.target_rank.shape
    stored = scores.has_position[:, None, :].expand(n_rows, n_layers, n_pos)
    row, layer, pos = stored.nonzero().unbind(1)  # row, then layer, then position order
    logprob = scores.target_logprob[row, layer, pos].double()
    ex = [examples[chunk[i][0]] for i in row.tolist()]
    gr = [grafts[chunk[i][1]] for i in row.tolist()]
    return pl.DataFrame(
        {
            "graft": [g.name for g in gr],
            "group": [g.group for g in gr],
            "spec": [str(g.spec) for g in gr],
            "template": [e.template for e in ex],
            "direction": [e.direction for e in ex],
            "prompt_id": [e.prompt_id for e in ex],
            "fact_id": [e.fact_id for e in ex],
            "data_seed": pl.Series([cfg.data_seed] * len(ex), dtype=pl.Int64),
            "position": [POSITIONS[p] for p in pos.tolist()],
            "layer": pl.Series(layer.tolist(), dtype=pl.Int64),
            "target_id": pl.Series([e.target_id for e in ex], dtype=pl.Int64),
            "target_rank": pl.Series(scores.target_rank[row, layer, pos].tolist(), dtype=pl.Int64),
            "target_prob": pl.Series(logprob.exp().tolist(), dtype=pl.Float64),
            "target_logprob": pl.Series(logprob.tolist(), dtype=pl.Float64),
        }
    )


@dataclass
class LensRun:
    """What :func:`run_lens` produced.

    Args:
        table: the per-(example, graft, layer, position) scores.
        summary: per (group, template, graft, position, layer): ``n``, ``mean_rank``,
            ``median_rank``, ``mean_prob``, ``mean_logprob``, ``acc@k`` with intervals.
        computed: the stored batches this call computed (empty when all were stored).
    """

    table: pl.DataFrame
    summary: pl.DataFrame
    computed: list[str]


def run_lens(
    cfg: ExperimentConfig,
    folder: RunFolder,
    config: Mapping[str, Any],
    grafts: Sequence[Graft],
    echo: Callable[[str], None] | None = None,
) -> LensRun:
    """Add the lens to the finished run in ``folder`` (its stored ``config``: the dataset and
    model paths the run used): the run's rows in its stored batches, each batch not stored
    yet traced and stored, then the table and its summary written. Resumable: a rerun
    computes only the missing batches.

    Args:
        cfg: the run's options (one replicate, local).
        folder: the run folder, its config written (``folder.run_key`` set).
        config: the run's ``config.json`` (``dataset.path``, ``base.path``,
            ``donors.<name>.path``).
        grafts: the run's grafts, in the order the run had them.
        echo: where the one-line plan goes (default: this module's logger).
    """
    check_lens_config(cfg)
    echo = echo or logger.info
    locks = Workspace.at(cfg.workspace).lock_dir
    with exclusive(folder.path, f"running the lens into {folder.path}", locks):
        done = folder.done_batches(LENS_TABLE)
        paths = RunPaths(
            config["base"]["path"], {n: d["path"] for n, d in config["donors"].items()}
        )
        models = load_run_models(cfg, paths, {})
        tok = models.base.tokenizer
        data = Path(config["dataset"]["path"])
        found, _ = load_examples(data, tok, cfg, context_length(models.base.model))
        examples = sample_examples(found, cfg.n, cfg.seed)
        rows, _ = plan_rows(examples, grafts)
        size = cfg.batch_size
        n_batches = math.ceil(len(rows) / size)
        missing = [b for b in range(n_batches) if str(b) not in done]
        echo(
            f"lens: {len(rows)} rows x {architecture_of(models.base.model).n_layers} layers x "
            f"{len(POSITIONS)} positions in {n_batches} batches "
            f"({n_batches - len(missing)} already done) -> {folder.path}"
        )
        donors = {n: m.model for n, m in models.donors.items()}
        bar = tqdm(total=len(missing), desc="lens", unit="batch", disable=not cfg.progress)
        for b in missing:
            chunk = rows[b * size : (b + 1) * size]
            scores = logit_lens(
                models.base.model,
                donors,
                graft_rows(examples, grafts, chunk),
                [examples[ei].target_id for ei, _ in chunk],
                pad_id=tok.pad_token_id,
            )
            folder.append_batch(LENS_TABLE, lens_frame(scores, chunk, examples, grafts, cfg), b)
            bar.update(1)
        bar.close()
        del models, donors
        table = folder.read(LENS_TABLE)
        folder.finalize(LENS_TABLE, table)
        summary = summarize_lens(table, grafts, cfg)
        folder.write_summary(summary, stem=LENS_SUMMARY)
    return LensRun(table, summary, [str(b) for b in missing])


def summarize_lens(
    table: pl.DataFrame, grafts: Sequence[Graft], cfg: ExperimentConfig
) -> pl.DataFrame:
    """The lens summary per (group, template, graft, position, layer), grafts in run order,
    with the run's bootstrap (:func:`graft.results.summary.summarize`)."""
    summary = summarize(table, by=list(LENS_BY), n_boot=cfg.n_boot, seed=cfg.seed)
    order = {g.name: i for i, g in enumerate(grafts)}
    places = {p: i for i, p in enumerate(POSITIONS)}
    return summary.sort(
        [
            pl.col("group"),
            pl.col("template"),
            pl.col("position").replace_strict(places, default=len(places)),
            pl.col("graft").replace_strict(order, default=len(order)),
            pl.col("layer"),
        ],
        maintain_order=True,
    )


def draw_lens_figures(folder: str | Path) -> list[Path]:
    """Draw the lens figures of the run in ``folder`` from ``lens_summary.parquet``: one per
    group and statistic of :data:`FIGURE_METRICS`, a panel per (position, template);
    ``figures/lens[_<group>]_<metric>.png`` (and ``.pdf``). Returns the PNG paths."""
    folder = Path(folder)
    config = RunFolder(folder).read_config() or {}
    run_key = str(config.get("run_key") or "")
    summary = read_table(folder / f"{LENS_SUMMARY}.parquet", LENS_SUMMARY, run_key)
    model = str(config.get("options", {}).get("model", "?"))
    order = [g["name"] for g in config.get("grafts", [])]
    out = []
    for (group,), part in summary.partition_by("group", as_dict=True, maintain_order=True).items():
        for metric in FIGURE_METRICS:
            fig = lens_chart(part, metric, order=order, model=model, positions=POSITIONS)
            stem = "lens" + (f"_{group}" if group else "") + f"_{metric}"
            png, _ = save_figure(fig, folder / "figures", stem)
            out.append(png)
    return out
