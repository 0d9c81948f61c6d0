"""The attribution experiment as a library object: an
:class:`~graft.study.specs.attribution.AttributionRequest` run into a run folder
(:func:`run_attribution`: every cell's estimate, the real grafts that check it, their
summaries, the map, ``config.json``) and the lines ``graft-exp attribution`` prints of it
(:func:`attribution_lines`).

Example::

    from graft.study import AttributionRequest, attribution_lines, run_attribution

    request = AttributionRequest(donor=folder, texts=prompts, targets=targets, verify=5)
    done = run_attribution(request, "attrib")
    print("\\n".join(attribution_lines(done)))
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from graft.core.api.attribution import attribute
from graft.core.api.attribution_verify import verify_attribution, verify_multicell
from graft.models import LoadedModel, load_model
from graft.results import (
    RunFolder,
    attribution_map,
    cell_summary,
    git_commit,
    git_dirty,
    multicell_summary,
    save_figure,
)
from graft.study.data.prompts import entity_prompts
from graft.study.specs.attribution import AttributionRequest
from graft.study.training.sources import finetune_record, model_fingerprint

#: the fields a folder's stored config must share for a run to resume it
KEY = ("experiment", "options", "base", "donors")
#: the verified cells :func:`attribution_lines` prints (all are in verify.csv)
PRINTED = 20
#: :class:`AttributionRun`'s tables and the files they are written as (``<name>.csv``)
_TABLES = {
    "table": "estimates",
    "summary": "summary",
    "checked": "verify",
    "multicell": "multicell",
    "multicell_summary": "multicell_summary",
}


@dataclass
class AttributionRun:
    """A finished attribution run: its tables (as written into the folder) and timings.

    Args:
        request: the request it ran.
        out: the run folder as it was given (the printed lines name its files so).
        folder: the run folder.
        config: the record ``config.json`` holds (besides what the folder adds: command,
            commit, machine, packages).
        table: :func:`graft.attribute`'s table, every cell (``estimates.csv``).
        summary: :func:`graft.results.cell_summary` per unit and kind (``summary.csv``).
        checked: with ``verify``: the cells grafted for real (``verify.csv``); else None.
        multicell: with ``multi_cell``: the multi-cell grafts (``multicell.csv``); else None.
        multicell_summary: their summary per set (``multicell_summary.csv``); else None.
        timings: seconds per step: ``attribution_seconds``, and ``verify_seconds``,
            ``multicell_seconds`` where they ran.
    """

    request: AttributionRequest
    out: str
    folder: RunFolder
    config: dict[str, Any]
    table: pl.DataFrame
    summary: pl.DataFrame
    checked: pl.DataFrame | None = None
    multicell: pl.DataFrame | None = None
    multicell_summary: pl.DataFrame | None = None
    timings: dict[str, float] = field(default_factory=dict)


def request_prompts(request: AttributionRequest) -> tuple[list[str], list[str], list[str]]:
    """The texts, targets and entities ``request`` runs on: its own, or its dataset's
    (:func:`graft.study.entity_prompts`; a DatasetError names what the dataset lacks)."""
    if request.dataset is None:
        return list(request.texts), list(request.targets), list(request.entity)
    found = [
        prompt
        for template in request.template.split(",")
        for prompt in entity_prompts(request.dataset, template.strip(), request.n_prompts)
    ]
    texts, targets, entity = (list(column) for column in zip(*found, strict=True))
    return texts, targets, entity


def run_attribution(
    request: AttributionRequest, out: str | os.PathLike[str], overwrite: bool = False
) -> AttributionRun:
    """Run ``request`` into the run folder ``out``: estimate every cell, graft the top
    ``verify`` cells (and with ``multi_cell`` the multi-cell sets) for real, and write
    ``estimates.csv``, ``summary.csv``, ``figures/attribution_map.png`` (and ``.pdf``),
    ``config.json`` and, where they ran, ``verify.csv``, ``multicell.csv`` and
    ``multicell_summary.csv``. The same request again rewrites the tables (a resume);
    another is refused unless ``overwrite``, which discards the old results.

    Raises:
        DatasetError: ``request.dataset`` lacks the prompts asked for.
        ModelNotFoundError: a model name that is no registry name, folder or hub id.
        SpecError: a kind no module of the model is (before anything is written).
        RunFolderError: ``out`` cannot be written, or holds results graft did not write.
        ConfigMismatchError: ``out`` holds the results of another request (not
            ``overwrite``).
    """
    texts, targets, entity = request_prompts(request)
    base, donor = load_model(request.base), load_model(request.donor)
    config = run_record(request, texts, targets, entity, base, donor)
    folder = RunFolder(out)
    folder.check_writable()
    if not overwrite:
        folder.check_config(config, KEY)
    args: dict[str, Any] = {
        "fields": [{"FE": name} for name in entity] if entity else None,
        "metric": request.metric,
    }
    prompts = (base, donor, None, texts, targets if len(targets) > 1 else targets[0])
    timings: dict[str, float] = {}
    start = time.perf_counter()
    table = attribute(*prompts, kinds=list(request.kinds), estimator=request.estimator, **args)
    timings["attribution_seconds"] = time.perf_counter() - start
    checked = multi = None
    if request.verify != 0:
        start = time.perf_counter()
        checked = verify_attribution(*prompts, table, top_k=request.verify, progress=True, **args)
        timings["verify_seconds"] = time.perf_counter() - start
    if request.multi_cell:
        start = time.perf_counter()
        multi = verify_multicell(*prompts, estimator=request.estimator, **args)
        timings["multicell_seconds"] = time.perf_counter() - start
    summary, sets = (
        cell_summary(table, checked),
        multi if multi is None else multicell_summary(multi),
    )
    done = AttributionRun(
        request, os.fspath(out), folder, config, table, summary, checked, multi, sets, timings
    )
    config.update({"cells": len(table), **{k: round(v, 3) for k, v in timings.items()}})
    folder.write_config(config, KEY, overwrite=overwrite)
    for name, written in _TABLES.items():
        if getattr(done, name) is not None:
            getattr(done, name).write_csv(folder.path / f"{written}.csv")
    save_figure(attribution_map(table, request.metric), folder.path / "figures", "attribution_map")
    folder.commit_config()
    return done


def run_record(
    request: AttributionRequest,
    texts: list[str],
    targets: list[str],
    entity: list[str],
    base: LoadedModel,
    donor: LoadedModel,
) -> dict[str, Any]:
    """What ``config.json`` records of a run before it computes: the request with the
    prompts it runs on (``options``: a resume must share them), both models with their
    folders' fingerprints, the ``finetune_config.json`` of each finetuned one, and the
    commit and whether the tree was dirty as the run starts (the record is stored when the
    run ends, and a change made meanwhile is not the run's)."""
    return {
        "experiment": "attribution",
        "options": {
            "model": request.base,
            "donor": request.donor,
            "dataset": request.dataset,
            "template": request.template if request.dataset is not None else None,
            "n": request.n_prompts,
            "texts": texts,
            "targets": targets,
            "entity": entity,
            "kinds": list(request.kinds),
            "metric": request.metric,
            "estimator": request.estimator,
            "verify": "all" if request.verify is None else request.verify,
            "multi_cell": request.multi_cell,
            "dtype": str(base.dtype).removeprefix("torch."),
        },
        "base": _model_entry(base),
        "donors": {"sft": _model_entry(donor)},
        "finetuned_models": {
            m.location: r for m in (base, donor) if (r := finetune_record(m.location)) is not None
        },
        # the code as it was when the run began: the record is written when it ends
        "git_commit": git_commit(),
        "git_dirty": git_dirty(),
    }


def _model_entry(model: LoadedModel) -> dict[str, Any]:
    """What a run records of a loaded model: its description and folder's fingerprint."""
    return {
        "path": model.location,
        "fingerprint": model_fingerprint(model.location),
        **model.describe(),
    }


def attribution_lines(done: AttributionRun) -> list[str]:
    """What ``graft-exp attribution`` prints of ``done``: the cells and the seconds; with
    ``verify`` the first :data:`PRINTED` real grafts and the agreement per unit and kind;
    with ``multi_cell`` one line per set."""
    out, table, checked, sets = done.out, done.table, done.checked, done.multicell_summary
    seconds = done.timings["attribution_seconds"]
    lines = [f"attribution: {len(table)} cells in {seconds:.1f} s -> {out}/estimates.csv"]
    if checked is not None:
        lines.append(
            f"verify: {len(checked)} real grafts in {done.timings['verify_seconds']:.1f} s"
        )
        lines += [
            f"  prompt {row['prompt']} {row['unit']}:{row['layer']}:{row['kind']}  "
            f"estimate {row['estimate']:+.4f}  real {row['real']:+.4f}"
            for row in checked.head(PRINTED).iter_rows(named=True)
        ]
        if len(checked) > PRINTED:
            lines.append(f"  ... {len(checked) - PRINTED} more in {out}/verify.csv")
        lines.append("agreement with the real grafts, per unit and kind:")
        lines += ["  " + _agreement_line(row) for row in done.summary.iter_rows(named=True)]
    if done.multicell is not None and sets is not None:
        lines.append(
            f"multi-cell: {len(done.multicell)} real grafts in "
            f"{done.timings['multicell_seconds']:.1f} s (estimate: the sum of the cells' "
            "estimates)"
        )
        lines += [
            f"  {row['set']:6} n={row['grafts']:<3} estimate {row['mean_estimate']:+.3f}  "
            f"real {row['mean_real']:+.3f}  mean |error| {row['mean_abs_error']:.3f}  "
            f"median relative error {_number(row['median_relative_error'])}"
            for row in sets.iter_rows(named=True)
        ]
    return lines


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _interval(row: dict[str, Any]) -> str:
    """`` [low, high]``: the Pearson's interval over prompts, where the summary has one."""
    if row.get("pearson_low") is None:
        return ""
    return f" [{row['pearson_low']:.3f}, {row['pearson_high']:.3f}]"


def _agreement_line(row: dict[str, Any]) -> str:
    overlap = row.get("top_k_overlap")
    return (
        f"{row['unit']:4} {row['kind']:5} cells {row['verified']:<4} Pearson "
        f"{_number(row['pearson'])}{_interval(row)}  sign {_number(row['sign_agreement'])} "
        f"(of {row['moving']})  top-{row['top_k']} overlap {_number(overlap)}"
        + ("" if row["meets_bar"] is None else ("  >= 0.95" if row["meets_bar"] else "  < 0.95"))
    )
