"""Figures render headless and save PNG + PDF (graft.results.plots)."""

from __future__ import annotations

import json
import math

import matplotlib
import polars as pl
import pytest
from matplotlib.colors import to_hex
from matplotlib.text import Text

from graft.errors import GraftError
from graft.results.plots import (
    GRAFT_COLOR,
    PAPER_GID,
    REFERENCE_COLORS,
    bar_chart,
    component_chart,
    graft_label,
    heatmap,
    save_figure,
)
from graft.results.report import PAIR_LABELS, draw_figures
from graft.results.summary import summarize
from graft.storage.tables import save_table

GRAFTS = ["PRE", "SFT", "FE:all:all", "LT:all:all", "FE+LT:all:all", "(FE+LT)^C:all:all"]


def _summary(templates=("headline",), grafts=GRAFTS, group="") -> pl.DataFrame:
    rows = []
    for t_index, template in enumerate(templates):
        for i, graft in enumerate(grafts):
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
                    "mean_rank": 40.0 * i,
                    "mean_rank_lo": 30.0 * i,
                    "mean_rank_hi": 50.0 * i,
                    "group": group,
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


@pytest.mark.slow
def test_bar_chart(tmp_path):
    fig = bar_chart(_summary(), model="smollm2-135m", template="headline")
    ax = fig.axes[0]
    title = ax.get_title()
    assert "smollm2-135m" in title and "headline" in title and "n=50" in title
    assert [t.get_text() for t in ax.get_xticklabels()][:3] == ["PRE", "SFT", "FE"]
    assert any(t.get_text() == "0.15" for t in ax.texts)
    _check_saved(fig, tmp_path, "bar")
    with pytest.raises(GraftError, match="several rows"):
        bar_chart(_summary(("headline", "qa")))
    with pytest.raises(GraftError, match="not in the frame"):
        bar_chart(_summary(), order=["PRE", "XX"])


def _texts(fig) -> list[str]:
    return [t.get_text() for t in fig.findobj(Text) if t.get_text() and t.get_visible()]


def _bar_colors(ax) -> set[str]:
    return {to_hex(patch.get_facecolor()) for patch in ax.patches}


def _legend(fig):
    legend = fig.axes[0].get_legend() or fig.legends[0]
    colors = {to_hex(h.get_facecolor()) for h in legend.legend_handles}
    return legend, colors, [t.get_text() for t in legend.get_texts()]


def test_bar_chart_says_what_the_whiskers_are():
    fig = bar_chart(_summary())
    assert any("whiskers: 95% bootstrap CI" in t for t in _texts(fig))
    assert any(
        "whiskers: Wilson 95% CI" in t
        for t in _texts(bar_chart(_summary(), whiskers="Wilson 95% CI"))
    )
    no_ci = _summary().drop(["acc@5_lo", "acc@5_hi"])
    assert any("no confidence intervals" in t for t in _texts(bar_chart(no_ci)))


def test_bar_chart_legend_shows_every_bar_colour():
    summary = _summary(grafts=["PRE", "TASK", "RELATION", "FE:all:all", "LT:all:all"])
    refs = ["PRE", "TASK", "RELATION"]
    fig = bar_chart(summary, reference_labels=refs, legend_labels={"TASK": "TASK: set A"})
    legend, colors, texts = _legend(fig)
    assert colors == _bar_colors(fig.axes[0])  # one entry per colour, no colour unexplained
    assert len(colors) == 4 and to_hex(GRAFT_COLOR) in colors
    assert texts == ["PRE", "TASK: set A", "RELATION", "graft"]
    # references only: no graft entry
    _, colors, texts = _legend(bar_chart(_summary(grafts=["PRE", "SFT"])))
    assert texts == ["PRE", "SFT"] and colors == {to_hex(c) for c in REFERENCE_COLORS[:2]}


def test_rank_plots_say_lower_is_better_and_keep_the_legend_off_the_bars():
    fig = bar_chart(_summary(), "mean_rank")
    ax = fig.axes[0]
    assert "lower is better" in ax.get_ylabel()
    assert "lower is better" not in bar_chart(_summary()).axes[0].get_ylabel()
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    legend_box = ax.get_legend().get_window_extent(renderer)
    assert legend_box.x0 >= ax.get_window_extent(renderer).x1  # beside the axes, not on them
    top = max(t.get_position()[1] for t in ax.texts)  # value labels stay inside the axes
    assert top < ax.get_ylim()[1]


@pytest.mark.slow
def test_component_chart(tmp_path):
    summary = pl.concat([_summary(group="sft"), _summary(group="reversal")], how="vertical")
    fig = component_chart(
        summary, group="group", model="tiny", group_labels=PAIR_LABELS, title=None
    )
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 2
    assert [ax.get_title() for ax in axes] == [PAIR_LABELS["sft"], PAIR_LABELS["reversal"]]
    assert [t.get_text() for t in axes[0].get_yticklabels()][:3] == ["PRE", "SFT", "FE"]
    assert "n=50" in fig.get_suptitle()
    # readable at page width: 7 inches, nothing rotated, no text below 7 pt
    assert fig.get_figwidth() <= 7.0
    texts = [t for t in fig.findobj(Text) if t.get_text() and t.get_visible()]
    assert all(t.get_rotation() == 0 for t in texts)
    assert min(t.get_fontsize() for t in texts) >= 7
    _, colors, _ = _legend(fig)
    assert colors == set().union(*(_bar_colors(ax) for ax in axes))
    assert any("whiskers: 95% bootstrap CI" in t for t in _texts(fig))
    _check_saved(fig, tmp_path, "components")
    _check_saved(component_chart(_summary(), group=None), tmp_path, "components_single")


def _run_folder(tmp_path, experiment, summary, grafts, model="tiny-llama") -> str:
    folder = tmp_path / experiment
    folder.mkdir(parents=True)
    save_table(summary, folder / "summary.parquet", "summary")  # as graft writes it
    config = {"experiment": experiment, "options": {"model": model}}
    config["grafts"] = [{"name": g} for g in grafts]
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.slow
def test_figure_files_are_named_after_their_metric(tmp_path):
    folder = _run_folder(tmp_path, "position", _summary(("headline", "qa")), GRAFTS)
    acc = draw_figures(folder)
    rank = draw_figures(folder, "mean_rank")
    assert [p.name for p in acc] == ["position_headline_acc5.png", "position_qa_acc5.png"]
    assert [p.name for p in rank] == [
        "position_headline_mean_rank.png",
        "position_qa_mean_rank.png",
    ]
    assert all(p.is_file() for p in acc + rank)  # the second metric overwrote nothing
    with pytest.raises(GraftError, match="unknown metric 'acc@7'; use one of acc@5, mean_rank"):
        draw_figures(folder, "acc@7")


@pytest.mark.slow
def test_a_lens_runs_bar_charts_are_named_after_the_output_not_the_lens(tmp_path):
    # lens_* are the lens figures (graft.study.analyses.lens); the bars are the model's output
    folder = _run_folder(tmp_path, "lens", _summary(("headline", "qa")), GRAFTS)
    acc = draw_figures(folder)
    assert [p.name for p in acc] == ["final_layer_headline_acc5.png", "final_layer_qa_acc5.png"]
    assert not list((folder / "figures").glob("lens*"))


@pytest.mark.slow
def test_necessity_figures_say_pre_weights_go_into_sft(tmp_path):
    folder = _run_folder(tmp_path, "necessity", _summary(), GRAFTS)
    (png,) = draw_figures(folder)
    assert png.name == "necessity_headline_acc5.png"
    import graft.results.plots as plots

    captured = []
    original = plots.save_figure
    plots.save_figure = lambda fig, *a, **k: captured.append(fig) or original(fig, *a, **k)
    try:
        draw_figures(folder)
    finally:
        plots.save_figure = original
    text = " ".join(_texts(captured[0]))
    assert "PRE weights go into SFT" in captured[0].axes[0].get_xlabel()
    assert "SFT with PRE weights there" in text and "grafted back" in text


@pytest.mark.slow
def test_hybrid_and_component_figures_from_run_folders(tmp_path, monkeypatch):
    import graft.results.plots as plots

    captured = []
    original = plots.save_figure
    monkeypatch.setattr(
        plots, "save_figure", lambda fig, *a, **k: captured.append(fig) or original(fig, *a, **k)
    )
    hybrid = ["PRE", "TASK", "RELATION", "FE none + LT hybrid", "FE all + LT hybrid"]
    draw_figures(_run_folder(tmp_path, "hybrid", _summary(grafts=hybrid), hybrid))
    _, colors, texts = _legend(captured[-1])
    assert len(colors) == 4 and any(t.startswith("TASK") for t in texts)
    assert any(t.startswith("RELATION") for t in texts)
    summary = pl.concat([_summary(group="sft"), _summary(group="reversal")])
    (png,) = draw_figures(_run_folder(tmp_path, "component", summary, GRAFTS))
    assert png.name == "component_headline_acc5.png"
    titles = [ax.get_title() for ax in captured[-1].axes if ax.get_visible()]
    assert titles == [PAIR_LABELS["sft"], PAIR_LABELS["reversal"]]
    assert "n=50" in captured[-1].get_suptitle()


def _summarized(grafts, group="") -> pl.DataFrame:
    """A summary as runs write it (graft.results.metrics.summarize): per-metric ci_method."""
    rows = []
    for i, graft in enumerate(grafts):
        for j in range(20):
            rank = (i * 7 + j * 3) % 40
            rows.append(
                {
                    "graft": graft,
                    "group": group,
                    "template": "headline",
                    "target_rank": rank,
                    "target_prob": 1.0 / (rank + 2),
                    "target_logprob": -math.log(rank + 2),
                }
            )
    return summarize(pl.DataFrame(rows), by=["group", "template", "graft"], n_boot=20)


def _captured_figures(monkeypatch) -> list:
    import graft.results.plots as plots

    captured = []
    original = plots.save_figure
    monkeypatch.setattr(
        plots, "save_figure", lambda fig, *a, **k: captured.append(fig) or original(fig, *a, **k)
    )
    return captured


@pytest.mark.slow
def test_footnotes_name_each_metric_interval_method(tmp_path, monkeypatch):
    captured = _captured_figures(monkeypatch)
    position = _summarized(GRAFTS)
    folder = _run_folder(tmp_path, "position", position, GRAFTS)
    expected = {
        "acc@5": "whiskers: 95% Wilson interval",
        "mean_rank": "whiskers: 95% bootstrap CI",
        "mean_logprob": "whiskers: 95% bootstrap CI",
    }
    for metric, text in expected.items():
        draw_figures(folder, metric)
        assert any(text in t for t in _texts(captured[-1])), (metric, _texts(captured[-1]))
    assert not any("Wilson" in t for t in _texts(captured[-1]))
    ax = captured[-1].axes[0]  # log-probs are negative: the bars go below 0 and show
    assert ax.get_ylim() == (pytest.approx(1.12 * position["mean_logprob_lo"].min()), 0.0)
    summary = pl.concat([_summarized(GRAFTS, "sft"), _summarized(GRAFTS, "reversal")])
    draw_figures(_run_folder(tmp_path, "component", summary, GRAFTS))
    assert any("whiskers: 95% Wilson interval" in t for t in _texts(captured[-1]))
    # Summaries of older runs have no ci_method columns: they were bootstrapped.
    old = _run_folder(tmp_path, "necessity", _summary(), GRAFTS)
    draw_figures(old)
    assert any("whiskers: 95% bootstrap CI" in t for t in _texts(captured[-1]))


def test_heatmap(tmp_path):
    frame = pl.DataFrame(
        {
            "positions": [p for p in ("FE", "LT", "(FE+LT)^C") for _ in range(4)],
            "layers": ["0-7", "8-15", "16-23", "24-29"] * 3,
            "acc@5": [i / 12 for i in range(12)],
        }
    ).filter(pl.col("acc@5") != 0.5)  # one missing cell
    fig = heatmap(frame, title="layer windows", note="Cells: acc@5 over n=4 prompts")
    assert len(fig.axes) == 2  # the map and its colourbar
    assert "Cells: acc@5 over n=4 prompts" in _texts(fig)
    assert len(fig.axes[0].texts) == 11
    _check_saved(fig, tmp_path, "heatmap")
    with pytest.raises(GraftError, match="several rows"):
        heatmap(pl.concat([frame, frame]))


def test_backend_untouched():
    before = matplotlib.get_backend()
    bar_chart(_summary())
    assert matplotlib.get_backend() == before


def _paper_markers(fig) -> list:
    return [line for ax in fig.axes for line in ax.get_lines() if line.get_gid() == PAPER_GID]


def test_bar_chart_draws_the_papers_number_beside_its_bar():
    summary = _summary(grafts=["PRE", "SFT", "FE", "LT"])
    label = "paper (Gemma-1.1-2B, Fig. 2)"
    fig = bar_chart(summary, paper={"LT": (0.53, label), "SFT": (1.0, label), "XX": (0.5, "x")})
    markers = _paper_markers(fig)
    assert len(markers) == 2  # a name that is not plotted draws nothing
    points = sorted((float(m.get_xdata()[0]), float(m.get_ydata()[0])) for m in markers)
    # beside bar 1 (SFT) and bar 3 (LT), at the paper's values
    assert [round(x) for x, _ in points] == [1, 3] and [y for _, y in points] == [1.0, 0.53]
    assert all(m.get_marker() == "D" for m in markers)
    texts = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert texts.count(label) == 1  # one legend entry however many markers
    assert not _paper_markers(bar_chart(summary))


@pytest.mark.slow
def test_run_figures_carry_the_paper_number_of_the_models_paper_family(tmp_path, monkeypatch):
    captured = _captured_figures(monkeypatch)
    grafts = ["PRE", "SFT", "FE", "LT", "FE+LT", "(FE+LT)^C"]
    summary = _summary(("headline", "qa"), grafts=grafts)
    draw_figures(_run_folder(tmp_path / "g", "position", summary, grafts, "gemma3-270m"))
    headline, qa = captured[-2:]
    ys = sorted(float(m.get_ydata()[0]) for m in _paper_markers(headline))
    assert ys == [0.53, 1.0]  # Fig. 2: Gemma LT 53%, SFT 100% (headline only)
    assert "paper (Gemma-1.1-2B, Fig. 2)" in _texts(headline)
    assert any("Gemma-1.1-2B, a different model than gemma3-270m" in t for t in _texts(headline))
    assert not _paper_markers(qa)  # the paper states no qa number
    # its "≈" statements have no number to draw: the footnote states them
    note = " ".join(" ".join(_texts(headline)).split())
    assert (
        "Paper (Gemma-1.1-2B, Fig. 2 caption; not this model): FE+LT ≈ SFT; (FE+LT)^C ≈ PRE."
        in note
    )
    assert "≈" not in " ".join(_texts(qa))
    # the paper states no position number of a bar for Llama-3.2-1B, nor any for a tiny model
    for model in ("smollm2-135m", "tiny-gemma"):
        draw_figures(_run_folder(tmp_path / model, "position", summary, grafts, model))
        assert not any(_paper_markers(fig) for fig in captured[-2:])
    # a metric other than acc@5: no marker
    draw_figures(tmp_path / "g" / "position", "mean_rank")
    assert not _paper_markers(captured[-2])


@pytest.mark.slow
def test_hybrid_and_component_figures_name_the_papers_numbers(tmp_path, monkeypatch):
    captured = _captured_figures(monkeypatch)
    hybrid = ["PRE", "TASK", "RELATION", "FE none + LT hybrid", "FE ATTN + LT hybrid"]
    draw_figures(_run_folder(tmp_path, "hybrid", _summary(grafts=hybrid), hybrid, "smollm2-135m"))
    (marker,) = _paper_markers(captured[-1])
    assert float(marker.get_ydata()[0]) == 0.34  # Fig. 5: Llama3 34%
    assert "paper (Llama-3.2-1B, Fig. 5)" in _texts(captured[-1])
    # "FE FFN + LT hybrid ≈ FE none + LT hybrid" needs both bars: only one is drawn here
    assert "≈" not in " ".join(_texts(captured[-1]))
    sets = ["PRE", "SFT", "FFN", "O+FFN", "ATTN+O+FFN"]
    summary = pl.concat(
        [_summary(grafts=sets, group="sft"), _summary(grafts=sets, group="reversal")]
    )
    draw_figures(_run_folder(tmp_path, "component", summary, sets, "gemma3-270m"))
    note = " ".join(" ".join(_texts(captured[-1])).split())  # the footnote is wrapped
    assert "Paper (Gemma-1.1-2B, Fig. 4; not this model)" in note
    assert "O+FFN minus FFN = +0.29 in the reversal pair" in note
    draw_figures(_run_folder(tmp_path / "t", "component", summary, sets, "tiny-gemma"))
    assert "Paper (" not in " ".join(_texts(captured[-1]))


def test_the_lens_layer_axis_labels_emb_apart_from_layer_0():
    import matplotlib.pyplot as plt

    from graft.results.plots.lens import _layer_axis

    fig, ax = plt.subplots()
    _layer_axis(ax, list(range(-1, 30)))  # the embeddings, then 30 layers
    ticks = [round(t) for t in ax.get_xticks()]
    assert ticks[0] == -1 and 0 not in ticks and ticks[-1] == 29
    _layer_axis(ax, [-1, 0, 1])  # a tick per layer where there are few
    assert [round(t) for t in ax.get_xticks()] == [-1, 0, 1]
    plt.close(fig)
