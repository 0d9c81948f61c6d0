"""graft: dynamic weight grafting for transformer language models.

Run a pretrained base model while chosen components, at chosen token positions and
layers, compute with a finetuned donor's weights -- in one batched forward pass.

The notebook API, one import away (``import graft``)::

    base, donor = graft.tiny_pair("llama")          # or graft.load_model(...) twice
    logits = graft.graft_texts(base, {"sft": donor}, tok, text, ["none", "FE+LT:all:all"],
                               fields={"FE": "Keanu Reeves"})
    graft.target_metrics(logits, tok, " Laurence")  # rank, probability, hit@k per spec
    graft.score_targets(base, {"sft": donor}, tok, text, ["none", "FE+LT:all:all"],
                        " Laurence Fishburne", fields={"FE": "Keanu Reeves"})  # whole name
    with graft.trace(base, {"sft": donor}, tok, text, "FE+LT:all:all",
                     fields={"FE": "Keanu Reeves"}) as g:  # the graft as an nnsight trace
        h = g.model.model.layers[1].output.save()

Names are imported on first use, so ``import graft`` itself is instant.

The packages, lowest first: ``errors``, ``lazy``, ``ranges`` (numeric settings) and
``naming`` (file-name slugs); ``storage`` (whole-or-absent files, locks, tables with
provenance); ``core`` (the spec language and the grafting engine, in rooms: ``families``,
``language``, ``planning``, ``execution``, ``api``); ``models`` (models by name, embedded
offline models); ``results`` (metrics, run folders, statistics, figures) and ``remote``
(NDIF servers); ``study`` (the paper's study: data, donors, the runner, analyses).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from graft.lazy import lazy_exports

__version__ = "0.1.0"

#: module -> the public names it defines (each imported on first access; ``name=attr``
#: where the module calls it otherwise).
_EXPORTS = {
    "graft.errors": ("GraftError", "InputError", "StorageError", "RemoteError", "UpstreamError"),
    "graft.core.language.spec": ("GraftSpec", "parse_spec"),
    "graft.core.language.graft_object": ("Graft",),
    "graft.core.api.texts": ("graft_texts", "score_targets"),
    "graft.core.api.grafted_trace": ("trace",),
    "graft.core.api.generate": ("generate", "Generation"),
    "graft.core.api.attribution": ("attribute",),
    "graft.core.execution.engine": ("run_grafts", "score_grafts"),
    "graft.core.planning.plan": ("GraftRow",),
    "graft.models.tiny": ("tiny_pair",),
    "graft.models": ("load_model", "LoadedModel", "tiny_tokenizer"),
    "graft.results.metrics": ("example_metrics",),
    "graft.study.running.runner": ("ExperimentConfig", "ModelSource", "run_experiment"),
    "graft.study.specs.grafts": ("NamedGraft",),
    "graft.study.specs.run": ("RunSpecs", "resolve"),
}

__all__ = [
    "GraftError",
    "InputError",
    "StorageError",
    "RemoteError",
    "UpstreamError",
    "GraftSpec",
    "Graft",
    "parse_spec",
    "graft_texts",
    "score_targets",
    "trace",
    "generate",
    "Generation",
    "attribute",
    "run_grafts",
    "score_grafts",
    "GraftRow",
    "tiny_pair",
    "load_model",
    "LoadedModel",
    "tiny_tokenizer",
    "example_metrics",
    "target_metrics",
    "ExperimentConfig",
    "ModelSource",
    "NamedGraft",
    "run_experiment",
    "RunSpecs",
    "resolve",
]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    import polars as pl
    import torch

    from graft.core.api.attribution import attribute
    from graft.core.api.generate import Generation, generate
    from graft.core.api.grafted_trace import trace
    from graft.core.api.texts import graft_texts, score_targets
    from graft.core.execution.engine import run_grafts, score_grafts
    from graft.core.language.graft_object import Graft
    from graft.core.language.spec import GraftSpec, parse_spec
    from graft.core.planning.plan import GraftRow
    from graft.errors import GraftError, InputError, RemoteError, StorageError, UpstreamError
    from graft.models import LoadedModel, load_model, tiny_tokenizer
    from graft.models.tiny import tiny_pair
    from graft.results.metrics import example_metrics
    from graft.study.running.runner import ExperimentConfig, ModelSource, run_experiment
    from graft.study.specs.grafts import NamedGraft
    from graft.study.specs.run import RunSpecs, resolve


__getattr__, __dir__, _LAZY_NAMES = lazy_exports(__name__, _EXPORTS, globals())


def target_metrics(
    logits: torch.Tensor,
    tokenizer: Any,
    target: int | str | Sequence[int | str],
    labels: Sequence[str] | None = None,
) -> pl.DataFrame:
    """Metrics of a target token for final-position logits (:func:`graft_texts`' output).

    Args:
        logits: ``[..., vocab]``: e.g. ``[vocab]``, ``[specs, vocab]`` or
            ``[texts, specs, vocab]``; one table row per ``[vocab]`` vector, in order.
        tokenizer: the models' tokenizer (decodes the target and the top tokens), or a
            ``LoadedModel``.
        target: the target token: an id, or a text whose first token is the target (mind
            the leading space most tokenizers fold into a word); or one per row.
        labels: optional names of the rows (e.g. the specs), put in a first column ``graft``.

    Returns:
        :func:`graft.results.metrics.example_metrics`' table: ``target_rank`` (0 = top),
        ``target_prob``, ``target_logprob``, ``hit@k``, the top tokens with probabilities.
    """
    import polars as pl
    import torch

    from graft.errors import ResultsError
    from graft.results.metrics import example_metrics

    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a LoadedModel's own
    rows = torch.as_tensor(logits).reshape(-1, logits.shape[-1])
    targets = [target] * len(rows) if isinstance(target, int | str) else list(target)
    if len(targets) != len(rows):
        raise ResultsError(f"{len(targets)} targets for {len(rows)} rows of logits")
    ids = [_token_id(tokenizer, t) for t in targets]
    table = example_metrics(rows, ids, tokenizer)
    if labels is not None:
        if len(labels) != len(rows):
            raise ResultsError(f"{len(labels)} labels for {len(rows)} rows of logits")
        table = table.insert_column(0, pl.Series("graft", list(labels)))
    return table


def _token_id(tokenizer: Any, target: int | str) -> int:
    from graft.errors import ResultsError

    if isinstance(target, int):
        return target
    ids = tokenizer(target, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ResultsError(f"the target {target!r} tokenizes to nothing; give a non-empty text")
    return int(ids[0])
