"""benchmarks.results_figures' attribution form: a published run's map redrawn from its
``attribution_estimates.csv`` with graft's own figure code."""

from __future__ import annotations

import json

import matplotlib.image as mpimg
import numpy as np
import polars as pl
import pytest

from benchmarks import results_figures
from graft.results import PROVENANCE_FILE


def _estimates(folder, estimate: float = 1.0):
    folder.mkdir(exist_ok=True)
    rows = [
        {"prompt": p, "layer": ly, "unit": u, "kind": "mlp", "estimate": estimate * (ly + 1)}
        for p in range(2)
        for ly in range(3)
        for u in ("FE", "LT")
    ]
    path = folder / "attribution_estimates.csv"
    pl.DataFrame(rows).write_csv(path)
    return path


def test_the_map_is_drawn_from_the_estimates_and_follows_them(tmp_path, monkeypatch):
    titles = []
    draw = results_figures.attribution_map

    def spy(table, metric):
        titles.append((metric, table["estimate"].sum()))
        return draw(table, metric)

    monkeypatch.setattr(results_figures, "attribution_map", spy)
    csv = _estimates(tmp_path / "a")
    out = tmp_path / "map.png"
    assert results_figures.main([str(csv), str(out)]) == 0
    first = mpimg.imread(out)
    assert first.ndim == 3 and first.shape[1] > first.shape[0]
    assert titles == [("logprob", 2 * 2 * (1 + 2 + 3))]
    # other estimates, another map; a run measured in logits is titled so
    csv = _estimates(tmp_path / "b", estimate=-1.0)
    (tmp_path / "b" / PROVENANCE_FILE).write_text(
        json.dumps(
            {
                "experiments": {
                    "attribution": {"command": "graft-exp attribution --measure logit --out RUN"}
                }
            }
        )
    )
    results_figures.draw_attribution(csv, out)
    assert titles[-1][0] == "logit"
    assert not np.array_equal(first, mpimg.imread(out))


def test_a_missing_table_is_one_error(tmp_path):
    with pytest.raises(SystemExit, match="no .*attribution_estimates.csv"):
        results_figures.draw_attribution(tmp_path / "attribution_estimates.csv", tmp_path / "x.png")
    assert results_figures.main([str(tmp_path / "other.csv"), "x.png"]) == 2
