"""The result tables of README.md and docs/*.md are what ``python -m benchmarks.results_tables``
writes from the results/ folders; its markers, generators and errors."""

from __future__ import annotations

import polars as pl
import pytest

from benchmarks import paper_table, results_tables
from benchmarks.results_tables import BlockError, find_blocks, main
from graft.results.benchmark_tables import write_benchmark_table
from graft.results.publish import provenance_entries, publish_run
from tests.cli.test_publish import make_run, summary_frame

CLOSE = "<!-- /results-table -->"


def test_every_generated_block_matches_the_results_folders():
    """Fails when a table between results-table markers differs from what the generators
    write: rerun ``python -m benchmarks.results_tables`` (and commit the result)."""
    paths = results_tables.documents()
    differences = results_tables.check(paths)
    assert not differences, "\n".join(d.diff() for d in differences)
    assert sum(len(find_blocks(p.read_text(), p)) for p in paths) >= 1


def table_of_rows(name: str, folder, file: str, rows, keywords=None) -> list[str]:
    """The lines of generator ``name``'s table of ``folder`` once ``rows`` are its ``file``,
    checked to name that file as the one it read."""
    pl.DataFrame(rows).write_csv(folder / file)
    table, files = results_tables.GENERATORS[name].make([str(folder)], keywords or {})
    assert files == [folder / file]
    return table.splitlines()


def _doc(tmp_path, body: str):
    doc = tmp_path / "doc.md"
    doc.write_text(f"# Doc\n\nsome text\n\n{body}\n\nmore text\n")
    return doc


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            f"<!-- results-table: sumary results/x -->\n{CLOSE}",
            "doc.md:5: unknown generator 'sumary'; known: across, attribution, attribution-cost, attribution-multicell, contrasts, csv, examples, kinds, lens, metrics, paper, prose, provenance, seeds, speed, studies, study, summary",
        ),
        (
            "<!-- results-table: summary results/x -->\n| a |",
            "doc.md:5: results-table marker never closed",
        ),
        (f"| a |\n{CLOSE}", f"doc.md:6: {CLOSE} without an opening marker"),
        (
            "<!-- results-table: summary a -->\n<!-- results-table: summary b -->",
            "doc.md:6: a results-table marker inside the block opened at line 5",
        ),
        (f"<!-- results-table: -->\n{CLOSE}", "doc.md:5: the marker names no generator"),
        (
            f"<!-- results-table: summary 'open -->\n{CLOSE}",
            "doc.md:5: cannot read the marker's arguments",
        ),
        (
            f"<!-- results-table: summary no/such/folder -->\n{CLOSE}",
            "doc.md:5: summary: no folder no/such/folder",
        ),
        (
            f"<!-- results-table: summary a b -->\n{CLOSE}",
            "doc.md:5: summary: summary takes one FOLDER",
        ),
    ],
)
def test_a_bad_marker_is_one_line_exit_2(tmp_path, capsys, body, message):
    doc = _doc(tmp_path, body)
    before = doc.read_text()
    assert main([str(doc)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert doc.read_text() == before


def test_write_then_check_then_a_hand_edit_fails_the_check(tmp_path, capsys):
    run = tmp_path / "results" / "r"
    run.mkdir(parents=True)
    summary_frame().write_csv(run / "position_summary.csv")
    doc = _doc(tmp_path, f"<!-- results-table: summary {run} -->\n{CLOSE}")
    assert main(["--check", str(doc)]) == 1
    assert main([str(doc)]) == 0
    text = doc.read_text()
    assert "| graft | headline | qa | movie |" in text
    assert "| SFT | 0.10 [0.05, 0.15] | 0.10 [0.05, 0.15] | 0.10 [0.05, 0.15] |" in text
    assert "by `python -m benchmarks.results_tables`" in text
    assert text.startswith("# Doc\n\nsome text\n\n") and text.endswith(f"{CLOSE}\n\nmore text\n")
    capsys.readouterr()
    assert main(["--check", str(doc)]) == 0
    doc.write_text(text.replace("| SFT | 0.10", "| SFT | 0.11"))
    assert main(["--check", str(doc)]) == 1
    out = capsys.readouterr().out
    assert "doc.md:5: differs" in out and "-| SFT | 0.11" in out and "+| SFT | 0.10" in out


def test_summary_shows_replicates_and_takes_its_order_from_provenance(tmp_path):
    out = tmp_path / "results"
    publish_run(make_run(tmp_path / "run"), out)  # grafts PRE, SFT, LT, FE
    mean = summary_frame().with_columns(
        pl.lit(2).alias("n_seeds"), pl.lit("[0.0, 0.2]").alias("acc@5_per_seed")
    )
    one = summary_frame()
    pl.concat([one, mean], how="diagonal_relaxed").write_csv(out / "position_summary.csv")
    table, sources = results_tables.GENERATORS["summary"].make([str(out)], {})
    rows = table.splitlines()
    assert [r.split(" | ")[0] for r in rows[2:]] == ["| PRE", "| SFT", "| LT", "| FE"]
    assert rows[3].startswith("| SFT | 0.10 [0.05, 0.15] (0.00 / 0.20) |")
    assert sources == [out / "position_summary.csv"]
    table, _ = results_tables.GENERATORS["summary"].make([str(out)], {"grafts": "FE,PRE"})
    assert [r.split(" | ")[0] for r in table.splitlines()[2:]] == ["| FE", "| PRE"]


def test_summary_of_several_groups_needs_one_named(tmp_path):
    frame = pl.concat([summary_frame(group="sft"), summary_frame(group="reversal")])
    frame.write_csv(tmp_path / "component_summary.csv")
    make = results_tables.GENERATORS["summary"].make
    with pytest.raises(BlockError, match="holds the groups reversal, sft: name one"):
        make([str(tmp_path)], {"experiment": "component"})
    table, _ = make([str(tmp_path)], {"experiment": "component", "group": "sft"})
    assert len(table.splitlines()) == 6


def test_provenance_table_names_command_commit_machine_and_dates(tmp_path):
    out = tmp_path / "results"
    publish_run(make_run(tmp_path / "run"), out)
    write_benchmark_table(out, "paper_scale", [{"a": 1}], "python -m benchmarks.paper_scale")
    table, sources = results_tables.GENERATORS["provenance"].make([f"A={out}"], {})
    head, rule, position, bench = table.splitlines()
    assert head == "| run | model, protocol, seeds | command | commit | machine, threads | date |"
    assert position == (
        "| A: position | tiny-llama, graft's protocol, `cpu` preset, finetune seeds 0, 1, "
        "data seed 0, seed 0, n = 6 | `graft-exp position --model tiny-llama --n 6` | "
        "`0123456789ab` | 4-core Test CPU, 3 threads | 2026-11-01 (resumed 2026-11-02) |"
    )
    assert bench.startswith("| A: paper_scale | — | `python -m benchmarks.paper_scale` |")
    assert sources == [out / "provenance.json"]


def test_a_benchmarks_checkout_is_read_before_its_table_is_written(tmp_path, monkeypatch):
    import graft.results.benchmark_tables as benchmark_tables

    table = tmp_path / "results" / "paper_scale.csv"
    seen = []
    monkeypatch.setattr(benchmark_tables, "git_dirty", lambda: seen.append(table.exists()))
    write_benchmark_table(table.parent, "paper_scale", [{"a": 1}], "python -m benchmarks.x")
    assert seen == [False] and table.exists()


def test_provenance_of_a_legacy_folder_says_what_was_not_recorded(tmp_path):
    import json

    entry = {
        "kind": "experiment",
        "experiment": "hybrid",
        "files": {"hybrid_summary.csv": None},
        "command": "graft-exp hybrid --protocol paper",
        "model": "smollm2-135m",
        "protocol": "paper",
        "n": 50,
        "seeds": {"finetune_seeds": [0]},
        "missing": ["git_commit", "machine"],
        "legacy": {"in_results_since": "09d62bb", "date": "2026-11-26"},
    }
    record = {"format": 1, "experiments": {"hybrid": entry}, "benchmarks": {}}
    (tmp_path / "provenance.json").write_text(json.dumps(record))
    table, _ = results_tables.GENERATORS["provenance"].make([f"F={tmp_path}"], {})
    row = table.splitlines()[2]
    assert "published before provenance was recorded" in row
    assert "not recorded (in results/ since `09d62bb`)" in row
    assert row.endswith("| unknown | before 2026-11-26 |")


def test_speed_table_puts_dtypes_side_by_side(tmp_path):
    rows = [
        {
            "machine": "H200",
            "shape": "gpt2-xl",
            "params": 1.56e9,
            "dtype": d,
            "e1_engine_over_plain": e1,
            "e3_engine_over_plain": 0.5,
            "peak_over_bound": 0.9,
        }
        for d, e1 in (("float32", 2.961), ("bfloat16", 4.54))
    ]
    assert table_of_rows("speed", tmp_path, "paper_scale.csv", rows)[2] == (
        "| H200 | gpt2-xl (1.56 B) | float32 / bfloat16 | 2.96 / 4.54 | 0.50 / 0.50 | 0.90 / 0.90 |"
    )


def test_speed_table_keeps_a_proxy_apart_with_its_own_goals(tmp_path):
    common = {"machine": "cpu", "shape": "gpt2-xl", "dtype": "float32", "peak_over_bound": 0.9}
    rows = [
        {
            **common,
            "layers": 48,
            "width": 1600,
            "params": 1.56e9,
            "e1_engine_over_plain": 0.97,
            "e3_engine_over_plain": 0.34,
            "pass_peak": True,
            "goal_e1": 1.1,
            "goal_e3": 0.4,
            "pass_e1": True,
            "pass_e3": True,
        },
        {
            **common,
            "layers": 48,
            "width": 64,
            "params": 5.7e6,
            "e1_engine_over_plain": 1.56,
            "e3_engine_over_plain": 0.51,
            "pass_peak": None,
            "goal_e1": 1.3,
            "goal_e3": 0.6,
            "pass_e1": False,
            "pass_e3": True,
        },
    ]
    lines = table_of_rows("speed", tmp_path, "paper_scale.csv", rows)
    assert "E1 mix (goal)" in lines[0]
    assert lines[2] == (
        "| cpu | gpt2-xl (48 layers x d 1600, 1.56 B) | float32 | 0.97 (<= 1.1) | 0.34 (<= 0.4) "
        "| 0.90 |"
    )
    assert lines[3] == (
        "| cpu | gpt2-xl (48 layers x d 64, 0.01 B) | float32 | 1.56 (<= 1.3) **not met** | "
        "0.51 (<= 0.6) | n/a |"
    )


def test_paper_generator_calls_paper_table_markdown_where_it_exists(tmp_path, monkeypatch):
    make = results_tables.GENERATORS["paper"].make
    monkeypatch.delattr(paper_table, "paper_table_markdown", raising=False)
    with pytest.raises(BlockError, match="no paper_table_markdown"):
        make([f"A=smollm2-135m={tmp_path}"], {})
    seen = []
    monkeypatch.setattr(
        paper_table,
        "paper_table_markdown",
        lambda runs, margin, others, short: (
            seen.append((runs, margin, others, short)) or "| t |\n|---|"
        ),
        raising=False,
    )
    assert make([f"A=smollm2-135m={tmp_path}"], {"margin": "0.1"})[0] == "| t |\n|---|"
    assert seen == [([("A", "smollm2-135m", str(tmp_path))], 0.1, True, False)]
    # others=no: the rows on another quantity than the paper's are left out
    make([f"A=smollm2-135m={tmp_path}"], {"others": "no"})
    assert seen[-1][2] is False
    with pytest.raises(BlockError, match="others=maybe: yes or no"):
        make([f"A=smollm2-135m={tmp_path}"], {"others": "maybe"})
    # cells=short: the README's cells, the verdict and what decided it
    make([f"A=smollm2-135m={tmp_path}"], {"cells": "short"})
    assert seen[-1][3] is True
    with pytest.raises(BlockError, match="cells=tiny: full or short"):
        make([f"A=smollm2-135m={tmp_path}"], {"cells": "tiny"})


def test_list_names_every_generator(capsys):
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    for name in ("summary", "contrasts", "provenance", "paper", "across", "speed"):
        assert f"\n{name} " in f"\n{out}"


def test_markers_in_code_blocks_are_text(tmp_path):
    marker = "<!-- results-table: summary results/x -->"
    doc = _doc(tmp_path, f"    {marker}\n    {CLOSE}\n\n```\n{marker}\n```\n\n~~~md\n{CLOSE}\n~~~")
    assert find_blocks(doc.read_text(), doc) == []


def test_across_shows_one_seed_of_several_runs_with_their_machines(tmp_path):
    one = tmp_path / "one"
    publish_run(make_run(tmp_path / "run1"), one)  # seeds 0, 1 pooled, no per-seed rows
    replicated = summary_frame(grafts=("SFT", "FE+LT")).with_columns(
        pl.lit(None, dtype=pl.Int64).alias("finetune_seed")
    )
    seeds = pl.concat(
        [replicated]
        + [
            summary_frame(grafts=("SFT", "FE+LT")).with_columns(
                pl.lit(seed, dtype=pl.Int64).alias("finetune_seed"),
                (pl.col("acc@5") + seed / 100).alias("acc@5"),
            )
            for seed in (0, 1)
        ]
    )
    three = tmp_path / "three"
    publish_run(make_run(tmp_path / "run3"), three)
    seeds.write_csv(three / "position_summary.csv")
    make = results_tables.GENERATORS["across"].make
    with pytest.raises(BlockError, match="one ran finetune seeds \\[0, 1\\], not 0"):
        make([f"pooled={one}"], {"grafts": "SFT,FE+LT"})
    with pytest.raises(BlockError, match="no single SFT row of headline, seed 2"):
        make([f"seeds={three}"], {"grafts": "SFT,FE+LT", "finetune_seed": "2"})
    table, files = make([f"seeds={three}"], {"grafts": "SFT,FE+LT", "finetune_seed": "1"})
    head, rule, row = table.splitlines()
    assert head == "| run | machine, threads | SFT acc@5 | FE+LT acc@5 |"
    assert row == "| seeds | 4-core Test CPU, 3 threads | 0.01 [0.00, 0.05] | 0.11 [0.05, 0.15] |"
    assert three / "position_summary.csv" in files


def test_lens_table_puts_templates_in_each_layer_cell(tmp_path):
    rows = [
        {"template": t, "graft": g, "position": p, "layer": layer, "median_rank": r}
        for t, r0 in (("headline", 10.0), ("qa", 20.0), ("movie", 30.0))
        for g in ("PRE", "SFT")
        for p in ("LT", "FE-last")
        for layer, r in ((-1, r0 * 100), (1, r0 if g == "PRE" else 0.5))
    ]
    assert table_of_rows("lens", tmp_path, "lens_summary.csv", rows, {"layers": "-1,1"}) == [
        "| graft (headline / qa / movie) | emb | layer 1 |",
        "|---|---:|---:|",
        "| PRE | 1,000 / 2,000 / 3,000 | 10 / 20 / 30 |",
        "| SFT | 1,000 / 2,000 / 3,000 | 0.5 / 0.5 / 0.5 |",
    ]
    with pytest.raises(BlockError, match="no PRE row at layer 2, headline"):
        results_tables.GENERATORS["lens"].make([str(tmp_path)], {"layers": "2"})


@pytest.mark.parametrize(
    ("name", "keywords", "message"),
    [
        ("across", {"finetune_seed": "one"}, "finetune_seed=one: not a number"),
        ("lens", {"layers": "-1,x"}, "layers=-1,x: not whole numbers"),
        ("paper", {"margin": "wide"}, "margin=wide: not a number"),
    ],
)
def test_a_number_keyword_that_does_not_parse_is_named(tmp_path, name, keywords, message):
    (tmp_path / "lens_summary.csv").write_text("")  # the numbers are read before the table
    folder = f"A=smollm2-135m={tmp_path}" if name == "paper" else str(tmp_path)
    with pytest.raises(BlockError, match=f"^{message}$"):
        results_tables.GENERATORS[name].make([folder], keywords)


def test_csv_shows_the_named_columns_of_each_folders_table(tmp_path):
    for name, value in (("a", 4.0e-5), ("b", 0.25)):
        (tmp_path / name).mkdir()
        write_benchmark_table(
            tmp_path / name, "bound", [{"model": name, "diff": value, "x": 1}], "cmd"
        )
    make = results_tables.GENERATORS["csv"].make
    table, files = make(
        [str(tmp_path / "a"), str(tmp_path / "b")],
        {"file": "bound.csv", "columns": "model,diff", "headers": "model,graft - ref"},
    )
    assert table.splitlines() == [
        "| model | graft - ref |",
        "|---|---:|",
        "| a | 4.0e-05 |",
        "| b | 0.25 |",
    ]
    assert files == [tmp_path / "a" / "bound.csv", tmp_path / "b" / "bound.csv"]
    with pytest.raises(BlockError, match="lacks the columns nope"):
        make([str(tmp_path / "a")], {"file": "bound.csv", "columns": "nope"})
    table, _ = make(
        [str(tmp_path / "a")], {"file": "bound.csv", "columns": "diff", "format": ".2f"}
    )
    assert table.splitlines()[-1] == "| 0.00 |"


def test_every_results_folder_records_what_made_it():
    """Each folder of results/ carries its command, a clean graft commit, package versions,
    device, machine with thread count, and date: no number stands on a folder that cannot
    say what made it (republish with ``graft-exp publish`` or the benchmark's ``--out``)."""
    folders = sorted(p for p in (results_tables.ROOT / "results").iterdir() if p.is_dir())
    assert len(folders) >= 20
    for folder in folders:
        entries = provenance_entries(folder)
        assert entries, f"{folder.name}: no provenance.json, or it names nothing"
        for name, entry in entries:
            where = f"{folder.name}: {name}"
            assert not entry.get("legacy") and not entry.get("missing"), where
            assert entry["command"].startswith(("graft-exp ", "python -m benchmarks.")), where
            assert len(entry["git_commit"]) == 40 and entry["git_dirty"] is False, where
            assert entry["packages"]["torch"] and entry["packages"]["graft"], where
            assert entry["device"] and entry["machine"]["cpu"], where
            assert entry["machine"]["torch_threads"] >= 1, where
            assert entry["created"], where
