"""The logit lens under grafts: the residual stream at the last token (``LT``) and at the
first entity's last token (``FE-last``), at the embeddings and after every layer, decoded
through the graft's readout (its final norm and unembedding), scored on the row's target
token as the run scores its logits, with the top-k tokens of every readout.

:func:`logit_lens` does it for engine rows: one nnsight trace per batch
(:func:`graft.core.grafted_trace.trace_rows`, the engine's own trace code, so a grafted row's
layers are exactly the graft's), the input of the first layer (the embeddings, layer
:data:`EMBEDDING_LAYER` = -1, labelled ``emb``) and every layer's output saved at the two
positions only, the trace stopped after the last layer; each saved state then goes through
the readout, two positions per row and layer, never a vocabulary of logits for every
position. A reference that is a whole donor with its own head (``SFT``) is that donor's own
run (a trace of the donor, nothing grafted), as the engine routes it; ``none`` (``PRE``) is
the base's.

:func:`identical_lines` finds, from the specs alone, the grafts whose lens at a position is
an earlier graft's by causality: a graft whose cells at and before the read position (and
whose readout) are another's leaves that position's stream as the other's (at ``FE-last``,
``LT`` grafts nothing before it and equals ``PRE``; ``FE+LT`` equals ``FE``).

:func:`run_lens` adds the lens to a finished experiment run: the same rows in the same stored
batches, stored as ``parts/lens/<batch>.parquet`` (resumable as the run's own batches are),
combined into ``lens.parquet``, summarised per (group, template, graft, position, layer)
into ``lens_summary.parquet`` and ``.csv`` with :func:`graft.results.summary.summarize`
(means, medians and their bootstrap intervals over prompts, and ``same_as``), and the top-1
tokens of a few prompts written to ``lens_top_tokens.csv``. :func:`draw_lens_figures` draws
the summary (:func:`graft.results.plots.lens.lens_chart`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import nnsight
import polars as pl
import torch
from torch import nn
from tqdm.auto import tqdm

from graft.core.arch import Architecture, architecture_of
from graft.core.grafted_trace import trace_rows
from graft.core.plan import GraftRow
from graft.core.spec import GraftSpec, parse_spec
from graft.core.wrapping import unwrap
from graft.errors import ExperimentError
from graft.models import context_length
from graft.results.folder import RunFolder
from graft.results.plots import save_figure
from graft.results.plots.lens import EMBEDDING_LAYER, layer_label, lens_chart
from graft.results.summary import summarize
from graft.storage.locks import exclusive
from graft.storage.tables import read_table, write_csv
from graft.study.data.prompts import TestExample
from graft.study.data.rows import graft_rows, load_examples, plan_rows, sample_examples
from graft.study.running.run_inputs import RunPaths, load_run_models
from graft.study.specs.config import ExperimentConfig
from graft.study.specs.grafts import Graft
from graft.study.training.workspace import Workspace

logger = logging.getLogger(__name__)

#: The table of per-(row, layer, position) scores, and the stem of its summary.
LENS_TABLE = "lens"
LENS_SUMMARY = "lens_summary"
#: The human-readable table of top-1 tokens of a few prompts (``.csv`` only).
LENS_TOP_TOKENS = "lens_top_tokens"
#: The positions the lens reads: the last token, and the last token of the first entity.
POSITIONS = ("LT", "FE-last")
#: The columns one summary row is grouped by.
LENS_BY = ("group", "template", "graft", "position", "layer")
#: The summary statistics drawn, each in a figure of its own: the median rank (robust, on a
#: log axis) and the mean log-probability (the probability on a log scale: a mean
#: probability is ~0 below the last layers and its 0..1 axis showed nothing there).
FIGURE_METRICS = ("median_rank", "mean_logprob")
#: The top tokens stored per (row, layer, position) unless asked otherwise.
DEFAULT_TOP_K = 5
#: Prompts per template in ``lens_top_tokens.csv`` (the run's first sampled ones).
TOP_TOKEN_PROMPTS = 3
#: The per-(row, layer, position) top-k columns of the lens table.
TOP_COLUMNS = ("top_ids", "top_tokens", "top_probs")

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


# ------------------------------------------------------------ lines identical by causality


def read_position(row: GraftRow, position: str) -> int | None:
    """The prompt index (unpadded) the lens reads ``position`` at in ``row`` (``LT``: the
    last token; ``FE-last``: the first entity's last token), or None when it has none."""
    if position == "LT":
        return len(row.input_ids) - 1
    if position == "FE-last":
        fe = list(row.spans.get("FE", ()))
        return fe[-1] if fe else None
    raise ExperimentError(f"unknown lens position {position!r}; use one of {POSITIONS}")


def stream_key(row: GraftRow, arch: Architecture, position: str) -> Hashable | None:
    """What fixes the lens of ``row`` at ``position``, from its spec alone: two rows of one
    prompt with equal keys have the same stream there and the same readout, so the same lens.

    A causal model's state at position p depends on the tokens and weights at positions up to
    p only, so a graft's cells after p change nothing there: the key is the readout (whose
    final norm and unembedding) and the grafted cells at positions <= p (layer, component,
    position, donor). A whole donor with its own head (``SFT``) is that donor's run: its key
    is the donor's name. None when the row has no such position.
    """
    at = read_position(row, position)
    if at is None:
        return None
    owner = own_model(row.spec)
    if owner is not None:
        return ("own", owner)
    spans = {name: list(p) for name, p in row.spans.items()}
    resolved = row.spec.resolve(arch, len(row.input_ids), spans)
    cells = sorted(
        (layer, component, p, donor)
        for (layer, component), cell in resolved.cells.items()
        for p, donor in cell.items()
        if p <= at
    )
    return ("graft", resolved.final_norm_donor, resolved.unembed_donor, tuple(cells))


def identical_lines(
    examples: Sequence[TestExample],
    grafts: Sequence[Graft],
    rows: Sequence[tuple[int, int]],
    arch: Architecture,
    positions: Sequence[str] = POSITIONS,
) -> dict[tuple[str, str, str, str], str]:
    """Grafts whose lens is an earlier graft's by causality: ``(group, template, graft,
    position) -> the earlier graft`` (run order, the first of equal ones) where, on every
    prompt of the template, the two rows' :func:`stream_key` at the position agree (and the
    two grafts run on the same prompts). Decided from the specs and prompts, never by name:
    at ``FE-last``, ``LT`` (cells at the last token only) is ``PRE`` and ``FE+LT`` is ``FE``;
    under ``head=donor`` ``LT`` reads out with the donor's head and is ``PRE`` no more.

    Args:
        examples: the run's examples.
        grafts: its grafts, in run order.
        rows: its rows, (example index, graft index) (:func:`graft.study.data.rows.plan_rows`).
        arch: the base's architecture.
        positions: the read positions.
    """
    keys: dict[tuple[str, str, int], list[tuple[str, Hashable]]] = {}
    for (ei, gi), row in zip(rows, graft_rows(examples, grafts, rows), strict=True):
        for position in positions:
            key = stream_key(row, arch, position)
            if key is not None:
                keys.setdefault((examples[ei].template, position, gi), []).append(
                    (examples[ei].prompt_id, key)
                )
    # per (template, position, graft): its keys in prompt order (a prompt id is one row)
    lines = {at: tuple(sorted(found, key=lambda k: k[0])) for at, found in keys.items()}
    same: dict[tuple[str, str, str, str], str] = {}
    for (template, position, gi), line in lines.items():
        graft = grafts[gi]
        for earlier in range(gi):
            other = grafts[earlier]
            if other.group == graft.group and lines.get((template, position, earlier)) == line:
                same[(graft.group, template, graft.name, position)] = other.name
                break
    return same


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


def token_texts(tokenizer: Any, ids: Iterable[int]) -> dict[int, str]:
    """Each id's text, decoded alone by ``tokenizer`` (``" Paris"``, with its space)."""
    unique = sorted(set(ids))
    return dict(zip(unique, tokenizer.batch_decode([[i] for i in unique]), strict=True))


def lens_frame(
    scores: LensScores,
    chunk: Sequence[tuple[int, int]],
    examples: Sequence[TestExample],
    grafts: Sequence[Graft],
    cfg: ExperimentConfig,
    tokenizer: Any,
) -> pl.DataFrame:
    """One stored batch of the lens table: a row per (example, graft, layer, position), the
    layer -1 (:data:`EMBEDDING_LAYER`) the embeddings, then the output of each layer; the
    target's rank and probability and the top-k tokens (ids, texts decoded by
    ``tokenizer``, probabilities)."""
    n_rows, n_layers, n_pos = scores.target_rank.shape
    stored = scores.has_position[:, None, :].expand(n_rows, n_layers, n_pos)
    row, layer, pos = stored.nonzero().unbind(1)  # row, then layer, then position order
    logprob = scores.target_logprob[row, layer, pos].double()
    top_ids = scores.top_ids[row, layer, pos].tolist()
    top_probs = scores.top_logprob[row, layer, pos].double().exp().tolist()
    ex = [examples[chunk[i][0]] for i in row.tolist()]
    gr = [grafts[chunk[i][1]] for i in row.tolist()]
    texts = token_texts(tokenizer, [i for ids in top_ids for i in ids] + [e.target_id for e in ex])
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
            "layer": pl.Series((layer + EMBEDDING_LAYER).tolist(), dtype=pl.Int64),
            "target_id": pl.Series([e.target_id for e in ex], dtype=pl.Int64),
            "target_token": pl.Series([texts[e.target_id] for e in ex], dtype=pl.Utf8),
            "target_rank": pl.Series(scores.target_rank[row, layer, pos].tolist(), dtype=pl.Int64),
            "target_prob": pl.Series(logprob.exp().tolist(), dtype=pl.Float64),
            "target_logprob": pl.Series(logprob.tolist(), dtype=pl.Float64),
            "top_ids": pl.Series(top_ids, dtype=pl.List(pl.Int64)),
            "top_tokens": pl.Series(
                [[texts[i] for i in ids] for ids in top_ids], dtype=pl.List(pl.Utf8)
            ),
            "top_probs": pl.Series(top_probs, dtype=pl.List(pl.Float64)),
        }
    )


def stale_batches(stored: pl.DataFrame, width: int) -> set[str]:
    """Batches of ``stored`` (the lens parts read with a ``batch`` column) written in an
    older layout or with another top-k: no embedding layer, no top-k columns, or top-k lists
    of another ``width``. Such a batch is computed again."""
    if stored.is_empty():
        return set()
    batches = set(stored["batch"].unique().to_list())
    if any(c not in stored.columns for c in ("layer", *TOP_COLUMNS)):
        return batches
    fresh = (
        stored.group_by("batch")
        .agg(
            (pl.col("layer").min() == EMBEDDING_LAYER).alias("emb"),
            (pl.col("top_ids").list.len() == width).all().alias("width"),
        )
        .filter(pl.col("emb") & pl.col("width"))
    )
    return batches - set(fresh["batch"].to_list())


@dataclass
class LensRun:
    """What :func:`run_lens` produced.

    Args:
        table: the per-(example, graft, layer, position) scores and top-k tokens.
        summary: per (group, template, graft, position, layer): ``n``, ``mean_rank``,
            ``median_rank``, ``mean_prob``, ``mean_logprob``, ``acc@k`` with intervals, and
            ``same_as``.
        computed: the stored batches this call computed (empty when all were stored).
        top_tokens: the top-1 tokens of a few prompts (``lens_top_tokens.csv``).
    """

    table: pl.DataFrame
    summary: pl.DataFrame
    computed: list[str]
    top_tokens: pl.DataFrame


def run_lens(
    cfg: ExperimentConfig,
    folder: RunFolder,
    config: Mapping[str, Any],
    grafts: Sequence[Graft],
    echo: Callable[[str], None] | None = None,
    *,
    top_k: int = DEFAULT_TOP_K,
) -> LensRun:
    """Add the lens to the finished run in ``folder`` (its stored ``config``: the dataset and
    model paths the run used): the run's rows in its stored batches, each batch not stored
    yet traced and stored, then the table, its summary and the top-1 token table written.
    Resumable: a rerun computes only the missing batches (and those stored in an older
    layout or with another ``top_k``).

    Args:
        cfg: the run's options (one replicate, local).
        folder: the run folder, its config written (``folder.run_key`` set).
        config: the run's ``config.json`` (``dataset.path``, ``base.path``,
            ``donors.<name>.path``).
        grafts: the run's grafts, in the order the run had them.
        echo: where the one-line plan goes (default: this module's logger).
        top_k: the top tokens stored per (row, layer, position).
    """
    check_lens_config(cfg)
    if top_k < 1:
        raise ExperimentError(f"top_k must be at least 1, not {top_k}", param="top_k")
    echo = echo or logger.info
    locks = Workspace.at(cfg.workspace).lock_dir
    with exclusive(folder.path, f"running the lens into {folder.path}", locks):
        done = folder.done_batches(LENS_TABLE)
        paths = RunPaths(
            config["base"]["path"], {n: d["path"] for n, d in config["donors"].items()}
        )
        models = load_run_models(cfg, paths, {})
        tok = models.base.tokenizer
        arch = architecture_of(unwrap(models.base.model))
        vocab = _module(models.base.model, {}, None, "unembed_path").get_parameter("weight")
        width = min(top_k, vocab.shape[0])
        data = Path(config["dataset"]["path"])
        found, _ = load_examples(data, tok, cfg, context_length(models.base.model))
        examples = sample_examples(found, cfg.n, cfg.seed)
        rows, _ = plan_rows(examples, grafts)
        size = cfg.batch_size
        n_batches = math.ceil(len(rows) / size)
        if done:
            done -= stale_batches(folder.read(LENS_TABLE, batch_column="batch"), width)
        missing = [b for b in range(n_batches) if str(b) not in done]
        echo(
            f"lens: {len(rows)} rows x ({arch.n_layers} layers + emb) x "
            f"{len(POSITIONS)} positions, top {width} tokens, in {n_batches} batches "
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
                top_k=top_k,
            )
            frame = lens_frame(scores, chunk, examples, grafts, cfg, tok)
            folder.append_batch(LENS_TABLE, frame, b)
            bar.update(1)
        bar.close()
        del models, donors
        table = folder.read(LENS_TABLE)
        folder.finalize(LENS_TABLE, table)
        same = identical_lines(examples, grafts, rows, arch)
        summary = summarize_lens(table, grafts, cfg, same)
        folder.write_summary(summary, stem=LENS_SUMMARY)
        shown = _first_prompts(examples, TOP_TOKEN_PROMPTS)
        top = top_tokens_table(table, shown, {e.prompt_id: e.text for e in examples}, grafts)
        write_csv(top, folder.path / f"{LENS_TOP_TOKENS}.csv")
    return LensRun(table, summary, [str(b) for b in missing], top)


def _first_prompts(examples: Sequence[TestExample], per_template: int) -> list[str]:
    """The first ``per_template`` prompt ids of each template in the run's (seeded) sample."""
    taken: dict[str, list[str]] = {}
    for e in examples:
        ids = taken.setdefault(e.template, [])
        if len(ids) < per_template and e.prompt_id not in ids:
            ids.append(e.prompt_id)
    return [i for ids in taken.values() for i in ids]


def summarize_lens(
    table: pl.DataFrame,
    grafts: Sequence[Graft],
    cfg: ExperimentConfig,
    same_as: Mapping[tuple[str, str, str, str], str] | None = None,
) -> pl.DataFrame:
    """The lens summary per (group, template, graft, position, layer), grafts in run order,
    with the run's bootstrap (:func:`graft.results.summary.summarize`); ``same_as``: the
    earlier graft whose line this one is by causality (:func:`identical_lines`), else null."""
    summary = summarize(
        table.drop(TOP_COLUMNS, strict=False), by=list(LENS_BY), n_boot=cfg.n_boot, seed=cfg.seed
    )
    same = same_as or {}
    keys = summary.select("group", "template", "graft", "position").iter_rows()
    summary = summary.with_columns(pl.Series("same_as", [same.get(k) for k in keys], dtype=pl.Utf8))
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


def top_tokens_table(
    table: pl.DataFrame,
    prompt_ids: Sequence[str],
    texts: Mapping[str, str] | None = None,
    grafts: Sequence[Graft] = (),
) -> pl.DataFrame:
    """The logit-lens table of a few prompts, one row per (template, prompt, graft, layer):
    at each position, the top-1 token (as Python writes the string, so spaces and newlines
    show) with its probability, and the target's rank there.

    Columns: ``template``, ``prompt_id``, ``prompt`` (with ``texts``), ``target`` (the
    target token), ``graft``, ``layer`` (``emb``, ``0``, ``1``, ...), then per position
    ``<position>`` (e.g. ``' Paris' 0.41``) and ``<position> target rank``.

    Args:
        table: the lens table (:func:`lens_frame`'s columns).
        prompt_ids: the prompts shown, in this order.
        texts: prompt id -> the prompt's text.
        grafts: the run's grafts (their order; default: as they appear).
    """
    picked = table.filter(pl.col("prompt_id").is_in(list(prompt_ids)))
    if picked.is_empty():
        return pl.DataFrame()
    cell = pl.format(
        "{} {}",
        pl.col("top_tokens").list.first().map_elements(repr, return_dtype=pl.Utf8),
        pl.col("top_probs").list.first().round(2).cast(pl.Utf8),
    )
    index = ["template", "prompt_id", "target_token", "graft", "layer"]
    long = picked.select(*index, "position", cell.alias("top1"), "target_rank")
    wide = long.pivot(on="position", index=index, values=["top1", "target_rank"])
    positions = [p for p in POSITIONS if f"top1_{p}" in wide.columns]
    order = {n: i for i, n in enumerate(dict.fromkeys([g.name for g in grafts]))}
    prompts = {p: i for i, p in enumerate(prompt_ids)}
    wide = wide.sort(
        pl.col("prompt_id").replace_strict(prompts, default=len(prompts)),
        pl.col("graft").replace_strict(order, default=len(order)),
        pl.col("layer"),
    )
    return wide.select(
        "template",
        "prompt_id",
        *(
            [pl.col("prompt_id").replace_strict(texts, default=None).alias("prompt")]
            if texts
            else []
        ),
        pl.col("target_token").map_elements(repr, return_dtype=pl.Utf8).alias("target"),
        "graft",
        pl.col("layer").map_elements(layer_label, return_dtype=pl.Utf8),
        *(
            c
            for p in positions
            for c in (
                pl.col(f"top1_{p}").alias(p),
                pl.col(f"target_rank_{p}").alias(f"{p} target rank"),
            )
        ),
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
            if metric not in part.columns:
                continue  # a summary without it (no log-probabilities)
            fig = lens_chart(part, metric, order=order, model=model, positions=POSITIONS)
            stem = "lens" + (f"_{group}" if group else "") + f"_{metric}"
            png, _ = save_figure(fig, folder / "figures", stem)
            out.append(png)
    return out
