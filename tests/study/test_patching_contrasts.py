"""Weights against patching per cell (graft.study.analyses.patching_contrasts): the status
of a cell is decided per prompt, so a cell identical by construction on one template only
is tested on the others."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from graft.study.analyses.patching_contrasts import method_contrasts


def _frames(n: int = 20):
    """Two whole-depth cells (FE, LT) x 2 methods x 2 templates of ``n`` prompts: FE is
    identical by construction on headline prompts only (FE at position 0), LT on none;
    patching sits 1 nat above weights on qa prompts."""
    rng = np.random.default_rng(0)
    rows, flags = [], []
    base = {t: rng.normal(-3, 1, n) for t in ("headline", "qa")}
    for unit in ("FE", "LT"):
        for method in ("weights", "patching"):
            for template in ("headline", "qa"):
                shift = 1.0 if (method == "patching" and template == "qa") else 0.0
                for i in range(n):
                    cell = {
                        "direction": "restore",
                        "kind": "all layers",
                        "unit": unit,
                        "layer": None,
                        "method": method,
                    }
                    rows.append(
                        {
                            **cell,
                            "role": "cell",
                            "template": template,
                            "prompt_id": f"{template}{i}",
                            "hit@5": False,
                            "target_logprob": base[template][i] + shift,
                        }
                    )
                    same = unit == "FE" and template == "headline"
                    flags.append(
                        {
                            **cell,
                            "template": template,
                            "prompt_id": f"{template}{i}",
                            "identical": float(same),
                            "sanity": 0.0,
                        }
                    )
    schema = {"layer": pl.Int64}
    examples = pl.DataFrame(rows, schema_overrides=schema)
    flags = pl.DataFrame(flags, schema_overrides={**schema, "identical": pl.Float64})
    table = flags.group_by("direction", "kind", "unit", "layer", "method").agg(
        pl.col("identical").mean(), pl.col("sanity").mean()
    )
    return examples, table, flags


def test_a_cell_identical_on_some_prompts_is_tested_on_the_others():
    examples, table, flags = _frames()
    contrasts = method_contrasts(examples, table, n_boot=50, flags=flags)
    fe = contrasts.filter(pl.col("unit") == "FE").row(0, named=True)
    assert fe["status"] == "tested" and fe["n"] == 20 and fe["n_identical"] == 20
    # the 20 qa prompts are a real test: 1 nat on every one
    assert fe["target_logprob_diff"] == pytest.approx(1.0)
    assert fe["decided_by"] == "log-prob"
    lt = contrasts.filter(pl.col("unit") == "LT").row(0, named=True)
    assert lt["n"] == 40 and lt["n_identical"] == 0


def test_a_cell_identical_on_every_prompt_is_labelled_not_tested():
    examples, table, flags = _frames()
    every = flags.with_columns(
        pl.when(pl.col("unit") == "FE").then(1.0).otherwise(pl.col("identical")).alias("identical")
    )
    table = every.group_by("direction", "kind", "unit", "layer", "method").agg(
        pl.col("identical").mean(), pl.col("sanity").mean()
    )
    contrasts = method_contrasts(examples, table, n_boot=50, flags=every)
    fe = contrasts.filter(pl.col("unit") == "FE").row(0, named=True)
    assert fe["status"] == "identical by construction" and fe["n"] == 40
    # without flags (an older caller), the share alone decides, as before
    old = method_contrasts(examples, table, n_boot=50)
    assert old.filter(pl.col("unit") == "FE")["status"].to_list() == ["identical by construction"]
