"""Summaries, contrasts and figures of runs with several replicates (finetune or data seeds)."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from matplotlib.collections import PathCollection

from graft.results import plots
from graft.results.compare import (
    compare_run,
    control_name,
    control_pairs,
    format_comparison,
    key_contrasts,
    replicate_column,
)
from graft.results.over_seeds import format_per_seed, summarize_over_seeds
from graft.results.report import figure_rows
from graft.results.summary import summarize
from graft.storage.tables import save_table

BY = ["group", "template", "graft"]


def per_seed_rows(values: dict[str, list[float]], n: int = 50) -> pl.DataFrame:
    """Summary rows of one graft for finetune seeds 0.. with the given statistic values."""
    k = len(next(iter(values.values())))
    frame = {
        "group": [""] * k,
        "template": ["headline"] * k,
        "graft": ["FE+LT"] * k,
        "data_seed": [0] * k,
        "finetune_seed": list(range(k)),
        "n": [n] * k,
    }
    for stat, vals in values.items():
        frame |= {stat: vals, f"{stat}_lo": vals, f"{stat}_hi": vals}
        frame[f"{stat}_ci_method"] = ["95% Wilson interval"] * k
    return pl.DataFrame(frame)


def test_mean_over_seeds_with_a_t_interval_against_known_values():
    # mean 0.9, sd 0.1, t(0.975, 2 df) = 4.302653: half-width 0.248414
    rows = per_seed_rows({"acc@5": [0.9, 0.8, 1.0], "mean_logprob": [-1.0, -2.0, -3.0]})
    out = summarize_over_seeds(rows, BY)
    mean = out.filter(pl.col("finetune_seed").is_null()).row(0, named=True)
    assert mean["n_seeds"] == 3 and mean["n"] == 50
    assert mean["acc@5"] == pytest.approx(0.9)
    assert mean["acc@5_lo"] == pytest.approx(0.9 - 0.248414, abs=1e-6)
    assert mean["acc@5_hi"] == 1.0  # 1.148 clipped to what an accuracy can be
    assert mean["acc@5_per_seed"] == [0.9, 0.8, 1.0]
    # mean -2, sd 1: half-width 2.484138; the upper end clipped at 0
    assert mean["mean_logprob_lo"] == pytest.approx(-2 - 2.484138, abs=1e-6)
    assert mean["mean_logprob_hi"] == 0.0
    assert mean["acc@5_ci_method"] == (
        "95% t interval over 3 replicates (their values' mean and sd, 2 df), widened to the "
        "pooled within-replicate interval"
    )
    assert mean["per_seed_of"] == "d0-f0,d0-f1,d0-f2"
    assert out.filter(pl.col("finetune_seed").is_not_null())["n_seeds"].to_list() == [1, 1, 1]


def test_agreeing_seeds_keep_the_uncertainty_of_their_prompts():
    # three seeds at 1/50 each: the t interval has width 0; Wilson on 3/150 is [0.006825, 0.057147]
    rows = per_seed_rows({"acc@5": [0.02, 0.02, 0.02], "mean_logprob": [-2.0, -2.0, -2.0]})
    rows = rows.with_columns(mean_logprob_lo=pl.lit(-2.3), mean_logprob_hi=pl.lit(-1.7))
    out = summarize_over_seeds(rows, BY)
    mean = out.filter(pl.col("finetune_seed").is_null()).row(0, named=True)
    assert (mean["acc@5_lo"], mean["acc@5_hi"]) == pytest.approx((0.006825, 0.057147), abs=1e-5)
    # other statistics: the seeds' mean within-seed half-width (0.3) / sqrt(3)
    half = 0.3 / 3**0.5
    assert (mean["mean_logprob_lo"], mean["mean_logprob_hi"]) == pytest.approx(
        (-2.0 - half, -2.0 + half)
    )


def test_one_seed_per_group_adds_nothing():
    rows = per_seed_rows({"acc@5": [0.5]})
    assert summarize_over_seeds(rows, BY).equals(rows)


def test_per_seed_rows_keep_their_within_seed_intervals():
    rng = np.random.default_rng(0)
    table = pl.DataFrame(
        {
            "group": [""] * 40,
            "template": ["qa"] * 40,
            "graft": ["FE"] * 40,
            "data_seed": [0] * 40,
            "finetune_seed": [0] * 20 + [1] * 20,
            "target_rank": rng.integers(0, 20, 40),
            "target_prob": rng.random(40),
        }
    )
    per_seed = summarize(table, by=[*BY, "data_seed", "finetune_seed"], n_boot=50)
    out = summarize_over_seeds(per_seed, BY)
    seeds = out.filter(pl.col("finetune_seed").is_not_null())
    assert seeds.select(per_seed.columns).equals(per_seed)
    mean = out.filter(pl.col("finetune_seed").is_null())
    assert mean["acc@5"].item() == pytest.approx(per_seed["acc@5"].mean())


def test_format_per_seed():
    series = pl.Series("acc@5_per_seed", [[0.92, 0.84], None])
    assert format_per_seed(series).to_list() == ["0.920 / 0.840", None]


def examples(seeds=(0, 1), data_seeds=(0,), control: bool = False) -> pl.DataFrame:
    rows = []
    for d in data_seeds:
        for s in seeds:
            for p in range(6):
                for graft, hit in (("FE+LT", p < 4), ("SFT", p < 5), ("LT", p < 1), ("PRE", False)):
                    names = [graft] + ([control_name(graft)] if control else [])
                    for name in names:
                        good = hit and not name.endswith("]")
                        rows.append(
                            {
                                "graft": name,
                                "group": "",
                                "template": "headline",
                                "prompt_id": f"f{p}:headline:forward",
                                "data_seed": d,
                                "finetune_seed": s,
                                "hit@5": good,
                                "target_logprob": -1.0 - p - s if good else -9.0 - 0.1 * p,
                            }
                        )
    return pl.DataFrame(rows)


def test_replicate_column():
    one = examples(seeds=(0,))
    assert replicate_column(one) == (one, None)
    assert replicate_column(one.drop("data_seed", "finetune_seed"))[1] is None
    assert replicate_column(examples())[1] == "finetune_seed"
    grid, column = replicate_column(examples(seeds=(0, 1), data_seeds=(0, 1)))
    assert column == "replicate"
    assert sorted(grid["replicate"].unique().to_list()) == ["d0-f0", "d0-f1", "d1-f0", "d1-f1"]


@pytest.mark.slow
def test_key_contrasts_cluster_by_seed_and_add_control_twins():
    table = key_contrasts(examples(control=True), n_boot=200)
    pairs = list(table.select("graft_a", "graft_b").iter_rows())
    assert pairs == [
        ("FE+LT", "SFT"),
        ("LT", "PRE"),
        ("FE+LT", "FE+LT [control]"),
        ("SFT", "SFT [control]"),
        ("PRE", "PRE [control]"),
        ("LT", "LT [control]"),
    ]
    assert set(table["n_seeds"].to_list()) == {2}
    assert set(table["interval"].to_list()) == {"cluster-bootstrap"}
    twin = table.filter(pl.col("graft_b") == "FE+LT [control]").row(0, named=True)
    assert twin["n"] == 12 and twin["acc@5_diff"] == pytest.approx(4 / 6)
    assert twin["mcnemar_b"] == 8 and twin["mcnemar_c"] == 0


def test_control_pairs_only_for_twins_present():
    assert control_pairs(["FE+LT", "FE+LT [control]", "SFT"]) == [("FE+LT", "FE+LT [control]")]
    assert control_pairs(["FE+LT", "SFT"]) == []


@pytest.mark.slow
def test_compare_works_on_a_run_of_several_seeds(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    save_table(examples(seeds=(0, 1, 2)), folder / "examples.parquet", "examples")
    table = compare_run(folder, "FE+LT", "SFT", n_boot=200)
    assert table["n"].item() == 18 and table["n_seeds"].item() == 3
    text = format_comparison(table)
    assert "n=18 (prompt, replicate) pairs over 3 replicates" in text
    assert "cluster bootstrap over replicates, then prompts" in text


def test_figures_draw_the_mean_and_a_dot_per_seed():
    rows = per_seed_rows({"acc@5": [0.9, 0.8, 1.0]})
    summary = summarize_over_seeds(rows, BY)
    means, note = figure_rows(summary)
    assert means.height == 1 and "mean over 3 replicates (d0-f0, d0-f1, d0-f2" in note
    fig = plots.bar_chart(means, "acc@5", note=note, whiskers=plots.whiskers_text(means, "acc@5"))
    (ax,) = fig.axes
    (dots,) = [c for c in ax.collections if isinstance(c, PathCollection)]
    ys = sorted(p[1] for p in dots.get_offsets().tolist())
    assert ys == pytest.approx([0.8, 0.9, 1.0])
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "each replicate" in labels
    assert "t interval over 3 replicates" in fig._supxlabel.get_text()
    one = per_seed_rows({"acc@5": [0.5]})
    assert figure_rows(one) == (one, None)
    drawn = plots.bar_chart(one, "acc@5").axes[0].collections
    assert not [c for c in drawn if isinstance(c, PathCollection)]


def test_control_bars_have_their_own_colour_and_legend_entry():
    frame = pl.DataFrame({"graft": ["PRE", "FE+LT", "FE+LT [control]"], "acc@5": [0.0, 0.8, 0.1]})
    fig = plots.bar_chart(frame, "acc@5")
    (ax,) = fig.axes
    colours = [tuple(p.get_facecolor()) for p in ax.patches]
    assert colours[1] != colours[2] and colours[0] not in colours[1:]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("control donor" in label for label in labels)


def test_component_chart_draws_seed_points():
    rows = per_seed_rows({"acc@5": [0.2, 0.4]}).with_columns(graft=pl.lit("O+FFN"))
    summary = summarize_over_seeds(rows, BY)
    means, _ = figure_rows(summary)
    fig = plots.component_chart(means, "acc@5", group=None)
    dots = [c for ax in fig.axes for c in ax.collections if isinstance(c, PathCollection)]
    xs = sorted(x for c in dots for x, _ in c.get_offsets().tolist())
    assert xs == pytest.approx([0.2, 0.4])
    assert not math.isnan(means["acc@5_lo"].item())
