"""The ``seeds``, ``metrics`` and ``kinds`` table makers of the results-table markers
(:mod:`benchmarks.run_tables`)."""

from __future__ import annotations

import json

import polars as pl
import pytest

from benchmarks import results_tables
from benchmarks.results_tables import BlockError
from tests.test_results_tables import table_of_rows


def per_seed(folder, seeds, pooled=False, **metrics):
    """A position_summary.csv with one row per (template, graft, seed): the value of each
    metric is base + seed / 100 (a pooled row over the seeds too, if asked)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for template in ("headline", "qa"):
        for graft, base in metrics.items():
            for seed in seeds:
                rows.append(
                    {
                        "template": template,
                        "graft": graft,
                        "finetune_seed": seed,
                        "n_seeds": 1,
                        "acc@5": base + seed / 100,
                        "mean_logprob": -base,
                    }
                )
            if pooled:
                rows.append(
                    {
                        "template": template,
                        "graft": graft,
                        "finetune_seed": None,
                        "n_seeds": len(seeds),
                        "acc@5": 0.99,
                        "mean_logprob": 9.0,
                    }
                )
    pl.DataFrame(rows).write_csv(folder / "position_summary.csv")
    return folder


def test_seeds_puts_every_folders_seeds_in_order_with_their_mean(tmp_path):
    gpu = per_seed(tmp_path / "gpu", [0], PRE=0.0, SFT=0.5)
    cpu = per_seed(tmp_path / "cpu", [1, 2], pooled=True, PRE=0.0, SFT=0.5)
    make = results_tables.GENERATORS["seeds"].make
    table, files = make([str(cpu), str(gpu)], {})
    assert table.splitlines() == [
        "| graft | headline | qa |",
        "|---|---|---|",
        "| PRE | 0.00 / 0.01 / 0.02 (0.01) | 0.00 / 0.01 / 0.02 (0.01) |",
        "| SFT | 0.50 / 0.51 / 0.52 (0.51) | 0.50 / 0.51 / 0.52 (0.51) |",
    ]  # the pooled row (0.99) is not a seed
    assert files == [cpu / "position_summary.csv", gpu / "position_summary.csv"]
    table, _ = make([str(gpu), str(cpu)], {"metric": "mean_logprob", "minus": "PRE"})
    assert (
        table.splitlines()[2]
        == "| SFT | -0.50 / -0.50 / -0.50 (-0.50) | -0.50 / -0.50 / -0.50 (-0.50) |"
    )
    with pytest.raises(BlockError, match="a finetune seed appears twice"):
        make([str(gpu), str(gpu)], {})
    with pytest.raises(BlockError, match="minus=LT: no such graft"):
        make([str(gpu)], {"minus": "LT"})
    with pytest.raises(BlockError, match="format=x: not a float format"):
        make([str(gpu)], {"format": "x"})


def test_metrics_shows_several_metrics_of_one_finetune_over_the_templates(tmp_path):
    folder = per_seed(tmp_path / "run", [0], PRE=0.0, SFT=0.5)
    make = results_tables.GENERATORS["metrics"].make
    table, _ = make([str(folder)], {"metrics": "acc@5,mean_logprob", "formats": ".2f,.1f"})
    assert table.splitlines() == [
        "| graft | acc@5 headline / qa | mean_logprob headline / qa |",
        "|---|---|---|",
        "| PRE | 0.00 / 0.00 | -0.0 / -0.0 |",
        "| SFT | 0.50 / 0.50 | -0.5 / -0.5 |",
    ]
    with pytest.raises(BlockError, match="has no metric name_exact"):
        make([str(folder)], {"metrics": "name_exact"})
    two = per_seed(tmp_path / "two", [0, 1], PRE=0.0)
    with pytest.raises(BlockError, match="holds several finetune seeds"):
        make([str(two)], {"metrics": "acc@5"})


def kinds_csv(folder, counts):
    """top1_kinds.csv from {(seed, template, graft): (actor, actor_or_title, title,
    punct_function, other)}."""
    folder.mkdir(parents=True, exist_ok=True)
    kinds = ("actor", "actor_or_title", "title", "punct_function", "other")
    rows = [
        {
            "finetune_seed": seed,
            "template": template,
            "graft": graft,
            "kind": kind,
            "count": count,
            "n": sum(values),
        }
        for (seed, template, graft), values in counts.items()
        for kind, count in zip(kinds, values, strict=True)
    ]
    pl.DataFrame(rows).write_csv(folder / "top1_kinds.csv")
    return folder


def test_kinds_per_seed_on_one_template_and_per_template_for_one_seed(tmp_path):
    folder = kinds_csv(
        tmp_path / "run",
        {
            (0, "headline", "PRE"): (0, 0, 0, 4, 0),
            (1, "headline", "PRE"): (0, 0, 0, 3, 1),
            (0, "headline", "LT"): (3, 1, 0, 0, 0),
            (1, "headline", "LT"): (4, 0, 0, 0, 0),
            (0, "movie", "PRE"): (1, 0, 0, 3, 0),
            (1, "movie", "PRE"): (0, 0, 0, 4, 0),
            (0, "movie", "M"): (2, 0, 0, 2, 0),
            (1, "movie", "M"): (1, 0, 0, 3, 0),
        },
    )
    make = results_tables.GENERATORS["kinds"].make
    table, files = make([str(folder)], {"template": "headline"})
    assert table.splitlines() == [
        "| graft (of 4 rows, seed 0 / seed 1) | actor | actor or title | title "
        "| punctuation or function word | other |",
        "|---|---:|---:|---:|---:|---:|",
        "| PRE | 0 / 0 | 0 / 0 | 0 / 0 | 4 / 3 | 0 / 1 |",
        "| LT | 3 / 4 | 1 / 0 | 0 / 0 | 0 / 0 | 0 / 0 |",
    ]  # M has no headline row: left out
    assert files == [folder / "top1_kinds.csv"]
    with pytest.raises(BlockError, match="holds finetune seeds \\[0, 1\\]: name one"):
        make([str(folder)], {})
    table, _ = make([str(folder)], {"finetune_seed": "1"})
    assert table.splitlines()[2:] == [
        "| PRE | 0 / 0 / 0 / 3 / 1 | 0 / 0 / 0 / 4 / 0 |",
        "| LT | 4 / 0 / 0 / 0 / 0 | — |",
        "| M | — | 1 / 0 / 0 / 3 / 0 |",
    ]
    with pytest.raises(BlockError, match="has no finetune seed 5"):
        make([str(folder)], {"finetune_seed": "5"})
    with pytest.raises(BlockError, match="^finetune_seed=x: not a number$"):
        make([str(folder)], {"finetune_seed": "x"})


def test_kinds_of_one_finetune_take_the_seed_its_provenance_records(tmp_path):
    folder = kinds_csv(tmp_path / "run", {(3, "headline", "PRE"): (0, 0, 0, 4, 0)})
    frame = pl.read_csv(folder / "top1_kinds.csv").drop("finetune_seed")
    frame.write_csv(folder / "top1_kinds.csv")  # as a run of one finetune writes it
    make = results_tables.GENERATORS["kinds"].make
    with pytest.raises(BlockError, match="no finetune_seed column and no one recorded seed"):
        make([str(folder)], {})
    record = {"experiments": {"position": {"finetuned_models": {"d": {"seed": 3}}}}}
    (folder / "provenance.json").write_text(json.dumps(record))
    table, _ = make([str(folder)], {"template": "headline"})
    assert table.splitlines()[0].startswith("| graft (of 4 rows, seed 3) |")


def test_examples_shows_the_first_prompt_of_each_template_with_its_top_tokens(tmp_path):
    rows = [
        {
            "template": t,
            "graft": g,
            "prompt_id": f"{i}:{t}",
            "rank": r,
            "token": f" {g}{r}",
            "prob": 0.5 / (r + 1),
            "target_rank": 7 if g == "PRE" else 0,
            "text": f"prompt {i} {t}",
            "target_text": " X",
        }
        for t in ("movie", "headline")
        for i in (1, 2)
        for g in ("PRE", "SFT")
        for r in (2, 0, 1)
    ]
    assert table_of_rows("examples", tmp_path, "tokens_paper_top_tokens.csv", rows, {"k": "2"}) == [
        "| prompt (target) | graft | top 2 next tokens (probability) | target rank |",
        "|---|---|---|---:|",
        '| "prompt 1 headline" (" X") | PRE | " PRE0" 0.50, " PRE1" 0.25 | 7 |',
        '|  | SFT | " SFT0" 0.50, " SFT1" 0.25 | 0 |',
        '| "prompt 1 movie" (" X") | PRE | " PRE0" 0.50, " PRE1" 0.25 | 7 |',
        '|  | SFT | " SFT0" 0.50, " SFT1" 0.25 | 0 |',
    ]
    with pytest.raises(BlockError, match="k=x: not a whole number"):
        results_tables.GENERATORS["examples"].make([str(tmp_path)], {"k": "x"})
