""":func:`graft.attribute`'s estimates against real grafts: where they hold, measured.

:func:`verify_attribution` grafts single cells for real (each prompt's top cells, or every
cell) and puts the real effect beside each estimate. :func:`verify_multicell` grafts
multi-cell sets, each estimated by the sum of its single cells' estimates (each first order
downstream of its module, or of its attention block under the ``local`` estimator; the
cells' interactions left out): where the estimate is expected to fail. The sets checked,
per prompt, all of attention and the MLP (``attn,mlp``: q, k, v, their norms where the
family has them, o, and the whole MLP):

- ``layer``: one whole layer at every position, ``ALL:l:attn,mlp``, for each layer;
- ``FE``, ``LT``, ``FE+LT``: every layer at the unit, ``FE:all:attn,mlp`` and so on (units a
  prompt lacks are left out).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from graft.core.api.attribution import attribute, metric_scores, one_donor, prompt_inputs
from graft.core.api.texts import graft_texts
from graft.core.execution.executor import LocalExecutor

__all__ = ["MULTI_KINDS", "verify_attribution", "verify_multicell"]

#: the kinds a multi-cell set grafts (a spec's ``attn,mlp``)
MULTI_KINDS = ("attn", "mlp")
#: the position sets grafted in every layer: label -> the units they join
_UNIT_SETS = {"FE": ("FE",), "LT": ("LT",), "FE+LT": ("FE", "LT")}


def verify_attribution(
    base: Any,
    donors: Any,
    tokenizer: Any,
    texts: Sequence[str] | str,
    targets: Sequence[int | str] | int | str,
    table: Any,
    *,
    top_k: int | None = 10,
    fields: Sequence[Mapping[str, str]] | Mapping[str, str] | None = None,
    donor: str | None = None,
    metric: str = "logprob",
    progress: bool = False,
) -> Any:
    """Graft the ``top_k`` cells of each prompt (largest ``|estimate|`` in
    :func:`attribute`'s ``table``; ``None``: every cell of the table) for real, each alone
    (``"U:l:kind"`` through :func:`graft.graft_texts`, each prompt's cells run from their
    layer on: :class:`~graft.core.execution.executor.LocalExecutor` with ``resume_layers``);
    the table of those cells with the real effect beside the estimate in a column ``real``
    (the metric under the graft minus the base's). ``progress``: a bar per prompt."""
    import polars as pl

    tokenizer, text_list, target_ids, field_list = prompt_inputs(
        base, tokenizer, texts, targets, fields
    )
    one = {"sft": one_donor(donors, donor)}
    executor = LocalExecutor(resume_layers=True)
    parts = []
    for prompt, (text, named) in enumerate(zip(text_list, field_list, strict=True)):
        cells = table.filter(pl.col("prompt") == prompt).sort(
            pl.col("estimate").abs(), descending=True
        )
        cells = cells if top_k is None else cells.head(top_k)
        specs = [f"{u}:{ly}:{k}" for u, ly, k in cells.select("unit", "layer", "kind").iter_rows()]
        real = _real_effects(
            base,
            one,
            tokenizer,
            text,
            specs,
            target_ids[prompt],
            metric,
            fields=named,
            executor=executor,
            progress=f"verify {prompt + 1}/{len(text_list)}" if progress else False,
        )
        parts.append(cells.with_columns(real=pl.Series(real)))
    return pl.concat(parts)


def verify_multicell(
    base: Any,
    donors: Any,
    tokenizer: Any,
    texts: Sequence[str] | str,
    targets: Sequence[int | str] | int | str,
    *,
    fields: Sequence[Mapping[str, str]] | Mapping[str, str] | None = None,
    layers: Sequence[int] | None = None,
    donor: str | None = None,
    metric: str = "logprob",
    estimator: str = "local",
) -> Any:
    """Graft each prompt's multi-cell sets (see the module docstring; ``layers``: the whole
    layers checked, default all) for real and compare them with the sum of their cells'
    estimates (``estimator``: as for :func:`graft.attribute`).

    Returns:
        a polars table ``prompt``, ``set`` (``layer``, ``FE``, ``LT`` or ``FE+LT``),
        ``layer`` (the whole layer's index; null for the unit sets), ``spec`` (the graft),
        ``cells`` (how many single cells the sum adds), ``estimate``, ``real`` (the metric
        under the graft minus the base's) and ``error`` (``estimate - real``).
    """
    import polars as pl

    tokenizer, text_list, target_ids, field_list = prompt_inputs(
        base, tokenizer, texts, targets, fields
    )
    one = {"sft": one_donor(donors, donor)}
    estimates = partial(
        attribute,
        base,
        one,
        tokenizer,
        text_list,
        target_ids,
        fields=fields,
        kinds=MULTI_KINDS,
        metric=metric,
        estimator=estimator,
    )
    table = estimates(units=None)  # every unit's cells, for the unit sets
    whole = estimates(units=["ALL"], layers=layers)  # the whole layers' cells
    components = ",".join(MULTI_KINDS)
    records: list[dict[str, Any]] = []
    for prompt, (text, named) in enumerate(zip(text_list, field_list, strict=True)):
        sets: list[tuple[str, int | None, str, Any]] = []
        mine = whole.filter(pl.col("prompt") == prompt)
        for layer in sorted(set(mine["layer"].to_list())):
            cells = mine.filter(pl.col("layer") == layer)
            sets.append(("layer", layer, f"ALL:{layer}:{components}", cells))
        own = table.filter(pl.col("prompt") == prompt)
        present = set(own["unit"].to_list())
        for label, units in _UNIT_SETS.items():
            if set(units) <= present:
                cells = own.filter(pl.col("unit").is_in(list(units)))
                sets.append((label, None, f"{label}:all:{components}", cells))
        specs = [spec for _, _, spec, _ in sets]
        effects = _real_effects(
            base, one, tokenizer, text, specs, target_ids[prompt], metric, fields=named
        )
        for (label, layer, spec, cells), real in zip(sets, effects, strict=True):
            estimate = float(cells["estimate"].sum())
            records.append(
                {
                    "prompt": prompt,
                    "set": label,
                    "layer": layer,
                    "spec": spec,
                    "cells": len(cells),
                    "estimate": estimate,
                    "real": real,
                    "error": estimate - real,
                }
            )
    schema = {
        "prompt": pl.Int64,
        "set": pl.Utf8,
        "layer": pl.Int64,
        "spec": pl.Utf8,
        "cells": pl.Int64,
        "estimate": pl.Float64,
        "real": pl.Float64,
        "error": pl.Float64,
    }
    return pl.DataFrame(records, schema=schema)


def _real_effects(
    base: Any,
    one: Mapping[str, Any],
    tokenizer: Any,
    text: str,
    specs: Sequence[str],
    target: int,
    metric: str,
    **graft_options: Any,
) -> list[float]:
    """What each of ``specs`` grafted for real moves ``metric`` of ``target`` on ``text``:
    its value under the graft minus the ungrafted base's (run first, in the same batch;
    ``graft_options``: :func:`graft.graft_texts`' keywords)."""
    logits = graft_texts(base, one, tokenizer, text, ["none", *specs], **graft_options)
    values = metric_scores(logits.double(), metric)[:, target]
    return (values[1:] - values[0]).tolist()
