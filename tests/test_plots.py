"""Figures render headless and save PNG + PDF (graft.plots)."""

from __future__ import annotations

import matplotlib
import polars as pl
import pytest

from graft.plots import bar_chart, component_chart, graft_label, heatmap, save_figure

GRAFTS = ["PRE", "SFT", "FE:all:all", "LT:all:all", "FE+LT:all:all", "(FE+LT)^C:all:all"]


def _summary(templates=("headline",)) -> pl.DataFrame:
    rows = []
    for t_index, template in enumerate(templates):
        for i, graft in enumerate(GRAFTS):
            v = (i * 0.15 + 0.05 * t_index) % 1
            rows.append(
                {
                    "graft": graft,
                    "template": template,
                    "n": 50,
                    "n_dropped": 2,
                    "acc@5": v,
                    "acc@5_lo": max(v - 0.1, 0),
                    "acc@5_hi": min(v + 0.1, 1),
                }
            )
    return pl.DataFrame(rows)


def _check_saved(fig, tmp_path, stem):
    png, pdf = save_figure(fig, tmp_path / "figs", stem)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 1000
    assert not list((tmp_path / "figs").glob(".*"))  # no temp files left


def test_labels():
    assert graft_label("FE+LT:all:all") == "FE+LT"
    assert graft_label("(FE+LT)^C") == "(FE+LT)$^{C}$"
    assert graft_label("none") == "PRE"
    assert graft_label("LT:q4:o,ffn") == "LT:q4:o,ffn"


def test_bar_chart(tmp_path):
    fig = bar_chart(_summary(), model="smollm2-135m", template="headline")
    ax = fig.axes[0]
    title = ax.get_title()
    assert "smollm2-135m" in title and "headline" in title and "n=50" in title
    assert [t.get_text() for t in ax.get_xticklabels()][:3] == ["PRE", "SFT", "FE"]
    assert any(t.get_text() == "0.15" for t in ax.texts)
    _check_saved(fig, tmp_path, "bar")
    with pytest.raises(ValueError, match="several rows"):
        bar_chart(_summary(("headline", "qa")))
    with pytest.raises(ValueError, match="not in the frame"):
        bar_chart(_summary(), order=["PRE", "XX"])


def test_component_chart(tmp_path):
    fig = component_chart(_summary(("headline", "qa", "movie")), model="tiny")
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["headline", "qa", "movie"]
    _check_saved(fig, tmp_path, "components")
    _check_saved(component_chart(_summary(), group=None), tmp_path, "components_single")


def test_heatmap(tmp_path):
    frame = pl.DataFrame(
        {
            "positions": [p for p in ("FE", "LT", "(FE+LT)^C") for _ in range(4)],
            "layers": ["0-7", "8-15", "16-23", "24-29"] * 3,
            "acc@5": [i / 12 for i in range(12)],
        }
    ).filter(pl.col("acc@5") != 0.5)  # one missing cell
    fig = heatmap(frame, title="layer windows")
    assert len(fig.axes) == 2  # the map and its colourbar
    assert len(fig.axes[0].texts) == 11
    _check_saved(fig, tmp_path, "heatmap")
    with pytest.raises(ValueError, match="several rows"):
        heatmap(pl.concat([frame, frame]))


def test_backend_untouched():
    before = matplotlib.get_backend()
    bar_chart(_summary())
    assert matplotlib.get_backend() == before
