"""The README's results table (benchmarks.paper_table: the paper's numbers against the
committed runs, agrees / disagrees / undecided) and the committed figures' redraw
(benchmarks.results_figures) from saved summaries."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from benchmarks import paper_table, results_figures

RESULTS = Path(__file__).resolve().parents[2] / "results"


RUNS = [
    ("A", "smollm2-135m", str(RESULTS / "smollm2-cpu-seeds012")),
    ("B", "smollm2-135m", str(RESULTS / "smollm2-cpu-paper-seeds012")),
    ("C", "gemma3-270m", str(RESULTS / "gemma3-cpu-seeds012")),
    ("D", "gemma3-270m", str(RESULTS / "gemma3-cpu-paper-seeds012")),
    ("F", "smollm2-135m", str(RESULTS / "smollm2-cpu-paper-hybrid-seed0")),
    ("G", "gemma3-270m", str(RESULTS / "gemma3-cpu-paper-hybrid-seed0")),
]


def _row(lines, start, run):
    (line,) = [x for x in lines if x.startswith(f"| {start}") and f"| {run} |" in x]
    return line


def test_table_of_the_committed_results():
    lines = paper_table.table(RUNS).splitlines()
    assert lines[0].startswith("| paper's finding") and "verdict" in lines[0]
    # LT over three seeds of Gemma3 under graft's protocol, [0.00, 1.00]: cannot fail, so
    # undecided
    lt = _row(lines, "Fig. 2: LT |", "C")
    assert "0.53 (paper: Gemma-1.1-2B)" in lt and "LT 0.51 [0.00, 1.00]" in lt
    assert "| undecided (" in lt and "[0.00, 1.00] is too wide to test against ±0.10" in lt
    # under the paper's protocol the interval holds the paper's 0.53 but is 0.31 wide: still
    # too wide for an equivalence at ±0.10, so undecided, not "agrees"
    lt = _row(lines, "Fig. 2: LT |", "D")
    assert "LT 0.57 [0.41, 0.72]" in lt
    assert "| undecided (" in lt and "[0.41, 0.72] is too wide to test against ±0.10" in lt
    # A's FE+LT falls short of SFT in the pooled table (McNemar p = 0.0015 over 150 pairs),
    # but the 3 seeds share their 50 prompts: the seed-level t test (p = 0.049), Holm over
    # Fig. 2's two claims (0.099), does not reject, and the interval reaches past -0.10
    fe_lt = _row(lines, "Fig. 2: FE+LT ≈ SFT", "A")
    assert "(paper: Llama-3.2-1B)" in fe_lt and "| undecided (" in fe_lt and "p = 0.099)" in fe_lt
    assert "Holm over the 2 Fig. 2 claims on this run" in fe_lt
    # floor against floor is no agreement
    floor = _row(lines, "Fig. 2: (FE+LT)^C ≈ PRE", "A")
    assert "0/150 vs PRE 0/150" in floor and "| undecided (" in floor
    assert "both at the floor" in floor
    # the hybrids fall far short of the paper's 63% and 34%
    assert "**disagrees**" in _row(lines, "Fig. 5: FE ATTN + LT hybrid", "G")
    assert "**disagrees**" in _row(lines, "Fig. 5: FE ATTN + LT hybrid", "F")
    # the hybrid runs' paired contrasts test "FE FFN ≈ none": on G's pairs (2 and 1
    # discordant of 50) Newcombe's interval passes, the exact test does not; F's two grafts
    # sit near the floor, so it tests nothing there
    ffn = "Fig. 5: FE FFN + LT hybrid ≈ FE none + LT hybrid"
    assert "| undecided (exact McNemar; " in _row(lines, ffn, "G")
    assert "exact unconditional TOST p = 0.16 does not reject" in _row(lines, ffn, "G")
    assert "| undecided (exact McNemar; " in _row(lines, ffn, "F")
    assert "within 0.10 of the floor" in _row(lines, ffn, "F")
    assert not any("any pairing of the hit counts" in _row(lines, ffn, r) for r in "FG")
    # numbers no run tests: one "not run" row (GPT2-XL's FE)
    assert sum("no committed run" in line for line in lines) == 1
    assert not any("Pythia" in line for line in lines)  # no run stands for Pythia
    # Fig. 4's numbers are on the paper's reversal pair; the runs have graft's sft pair only:
    # shown, labelled, no verdict
    fig4 = [line for line in lines if line.startswith("| Fig. 4")]
    assert fig4 and all("| no verdict: another quantity (graft's sft pair" in x for x in fig4)
    verdicts = [line.split(" | ")[4] for line in lines[2:] if "no committed run" not in line]
    assert all(
        v.startswith(("agrees (", "**disagrees** (", "undecided (", "no verdict: another"))
        for v in verdicts
    )


def test_no_committed_agreement_leaves_the_margin():
    checks, _ = paper_table.checks_of(RUNS)
    tally = paper_table.tally(checks)
    tested = [c for c in checks if c.agreement is not None]
    assert sum(tally.values()) == len(tested) and all(tally.values())
    # a check without a verdict is one on another quantity than the paper's, and says so
    assert all(c.note.startswith("no verdict") for c in checks if c.agreement is None)
    for check in tested:
        a = check.agreement
        if a.verdict == "agrees":
            assert a.target - a.margin - 1e-12 <= a.lo_tost <= a.hi_tost
            assert a.hi_tost <= a.target + a.margin + 1e-12
            assert a.hi - a.lo <= 2 * a.margin + 1e-12  # no agreement from a wide interval
        if a.verdict == "disagrees":
            assert a.lo is not None and a.hi is not None
    # a narrower margin agrees less often
    narrow, _ = paper_table.checks_of(RUNS, margin=0.02)
    assert paper_table.tally(narrow)["agrees"] < tally["agrees"]


def test_markdown_is_the_caption_and_the_table():
    text = paper_table.markdown(RUNS[:1])
    caption, table = text.split("\n\n")
    assert "α = 0.05" in caption and "δ = 0.10" in caption and "benchmarks.paper_table" in caption
    assert table == paper_table.table(RUNS[:1])
    assert "--margin 0.05" in paper_table.command(RUNS[:1], margin=0.05)
    # for benchmarks.results_tables: no command (it names its own), folders not shown
    block = paper_table.paper_table_markdown(RUNS[:1], None)
    assert block.split("\n\n")[1] == table and "benchmarks.paper_table" not in block
    assert str(RESULTS) not in block
    assert "δ = 0.20" in paper_table.paper_table_markdown(RUNS[:1], 0.2)


def test_usage_error_is_exit_2(capsys):
    assert paper_table.main(["A=results/x"]) == 2
    assert "usage" in capsys.readouterr().err
    assert paper_table.main(["--margin", "two", "A=m=results/x"]) == 2
    assert paper_table.main(["--margin=1.5", "A=m=results/x"]) == 2
    assert results_figures.main(["only-one"]) == 2


def test_margin_option(capsys):
    run = "=".join(RUNS[4])
    assert paper_table.main(["--margin", "0.3", run]) == 0
    out = capsys.readouterr().out
    assert "δ = 0.30" in out and "±0.30" in out and "--margin 0.3" in out


def test_figure_redrawn_from_a_summary_csv(tmp_path):
    rows = [
        {"group": "", "template": t, "graft": g, "n": 50, "acc@5": v, "acc@5_lo": 0.0}
        | {"acc@5_hi": 1.0}
        for t in ("headline", "qa")
        for g, v in (("PRE", 0.0), ("SFT", 1.0), ("LT", 0.7))
    ]
    csv = tmp_path / "position_summary.csv"
    pl.DataFrame(rows).write_csv(csv)
    out = results_figures.draw(csv, "gemma3-270m", "headline", tmp_path / "fig.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig.png", "position_summary.csv"]


def test_short_cells_carry_the_verdicts_of_the_full_table():
    full = paper_table.table(RUNS).splitlines()
    short = paper_table.table(RUNS, short=True).splitlines()
    assert short[0].endswith("| verdict: what decided it |") and len(full) == len(short)
    for long_row, short_row in zip(full[2:], short[2:], strict=True):
        long_cell, short_cell = long_row.split(" | ")[-1], short_row.split(" | ")[-1]
        assert long_cell.split(" ")[0] == short_cell.split(":")[0].split(" ")[0]
        assert len(short_cell) <= 150, short_cell
    lt = _row(short, "Fig. 2: LT |", "C")
    assert lt.endswith("| undecided: 95% interval [0.00, 1.00] too wide for ±0.10 |")


def test_no_readme_table_cell_is_over_300_characters():
    # the README links the verdict table; any table it shows keeps short cells
    readme = (RESULTS.parent / "README.md").read_text()
    cells = [c for line in readme.splitlines() if line.startswith("|") for c in line.split("|")]
    assert max(map(len, cells), default=0) <= 300, max(cells, key=len)
    assert "docs/results/papers-numbers-tested.md#the-papers-numbers-tested" in readme
    # the short table is the results index's overview, the full one its own study page
    index = (RESULTS.parent / "docs" / "results" / "index.md").read_text()
    tested = (RESULTS.parent / "docs" / "results" / "papers-numbers-tested.md").read_text()
    assert "others=no cells=short -->" in index and "| verdict: what decided it |" in index
    assert "results-table: paper " in tested
