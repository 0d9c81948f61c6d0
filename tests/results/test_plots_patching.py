"""The figures of a patching sweep (graft.results.plots.patching) on a hand-made sweep table:
each value lands in the cell or on the line of its unit, layer, kind and method."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from graft.errors import GraftError
from graft.results.plots.patching import patching_lines, patching_maps

UNITS = ("FE", "LT")
LAYERS = (0, 1, 2)
METHODS = ("weights", "patching")


def value(unit: str, layer: int, method: str) -> float:
    """The effect of one cell, by hand: every cell a different number in 0.05..0.8."""
    return 0.05 + 0.1 * layer + 0.3 * UNITS.index(unit) + 0.05 * METHODS.index(method)


def sweep() -> pl.DataFrame:
    rows = [
        {
            "direction": "restore",
            "kind": "attn",
            "unit": unit,
            "layer": layer,
            "method": method,
            "effect": value(unit, layer, method),
            "effect_lo": value(unit, layer, method) - 0.05,
            "effect_hi": value(unit, layer, method) + 0.05,
            "sanity": int((unit, layer, method) == ("LT", 2, "patching")),
        }
        for unit in UNITS
        for layer in LAYERS
        for method in METHODS
    ]
    # left out of the restore figures: a whole-depth row and a row of the other direction
    whole = rows[0] | {"layer": None, "effect": 9.0}
    other = rows[0] | {"direction": "break", "effect": -3.0}
    return pl.DataFrame([*rows, whole, other])


def test_maps_put_each_value_at_its_unit_and_layer():
    fig = patching_maps(sweep(), "restore", units=["LT", "FE"], model="tiny-llama", note="n=4")
    panels = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in panels] == ["attn, weights", "attn, patching"]
    for ax, method in zip(panels, METHODS, strict=True):
        grid = np.asarray(ax.images[0].get_array())
        want = [[value(unit, layer, method) for layer in LAYERS] for unit in ("LT", "FE")]
        assert np.allclose(grid, want, rtol=0, atol=1e-12)
        # an effect's scale is the data's range widened to 0..1: the whole-depth row (9.0)
        # and the break row (-3.0) are not in it
        assert ax.images[0].get_clim() == (0.0, 1.0)
    # the one cell whose patch copies the donor's whole stream is marked, at (layer 2, LT)
    assert not panels[0].texts
    assert [(t.get_text(), t.get_position()) for t in panels[1].texts] == [("=", (2, 0))]
    assert len(fig.axes) == 3  # two panels and the colour bar
    assert fig.get_suptitle() == "restore: weights vs patching, layer by layer (tiny-llama)"


def test_maps_of_an_accuracy_use_0_to_1_and_leave_missing_cells_empty():
    table = (
        sweep()
        .rename({"effect": "acc@5"})
        .filter(~((pl.col("unit") == "FE") & (pl.col("layer") == 1)))
    )
    fig = patching_maps(table, "restore", "acc@5", methods=["patching"])
    (panel,) = [ax for ax in fig.axes if ax.images]
    grid = np.asarray(panel.images[0].get_array(), dtype=float)
    assert math.isnan(grid[0, 1]) and not np.isnan(np.delete(grid, 1, axis=1)).any()
    assert panel.images[0].get_clim() == (0.0, 1.0)


def test_lines_draw_each_method_against_the_layer_with_its_band():
    fig = patching_lines(sweep(), "restore")
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["FE, attn", "LT, attn"]
    for ax, unit in zip(panels, UNITS, strict=True):
        lines = {line.get_label(): line for line in ax.get_lines() if line.get_label() in METHODS}
        assert sorted(lines) == sorted(METHODS)
        for method, line in lines.items():
            assert list(line.get_xdata()) == list(LAYERS)
            assert list(line.get_ydata()) == pytest.approx(
                [value(unit, la, method) for la in LAYERS]
            )
        assert len(ax.collections) == 2  # a 95% band per method
    assert fig.get_suptitle() == "restore: weights vs patching per layer"


def test_a_table_without_the_value_is_refused():
    with pytest.raises(GraftError, match="acc@5"):
        patching_maps(sweep(), "restore", "acc@5")
    with pytest.raises(GraftError, match="method"):
        patching_lines(sweep().drop("method"), "restore")
