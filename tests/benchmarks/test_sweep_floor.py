"""The sweep benchmark: its cells are the sweep's (and E7's), its floor counts only changed
layers and positions, and a tiny run prints every (method, unit) with old and new equal."""

from __future__ import annotations

import json

from benchmarks.sweep_floor import cell_work, main, sweep_cells
from graft.core import GraftRow, architecture_of, parse_spec


def test_the_floor_counts_changed_layers_and_positions(tiny_pairs):
    base, _ = tiny_pairs("llama")
    arch = architecture_of(base)  # 4 layers
    ids = list(range(3, 13))  # 10 tokens, FE at 2-3
    row = GraftRow(ids, {"FE": [2, 3]}, parse_spec("FE:1:o@sft"))
    assert cell_work(arch, row) == (4 - 1) * (10 - 2)
    last = GraftRow(ids, {"FE": [2, 3]}, parse_spec("LT:3:down@sft"))
    assert cell_work(arch, last) == 1 * 1
    assert cell_work(arch, GraftRow(ids, {}, parse_spec("none"))) == 0


def test_the_cells_are_the_sweeps(tiny_pairs):
    base, _ = tiny_pairs("llama")
    arch = architecture_of(base)
    cells = sweep_cells(arch, "weights", "LT")
    assert len(cells) == 3 * 4  # three kinds x four layers, no references
    assert {c.group for c in cells} == {"residual", "attn", "mlp"}
    assert len(sweep_cells(arch, "activation", "LT", layer_step=2)) == 2 * 2
    e7 = sweep_cells(arch, "e7", "FE+LT", layer_step=2)  # graft-exp layers --windows 2
    assert [str(c.spec) for c in e7] == ["FE+LT:0-1:block", "FE+LT:2-3:block"]


def test_a_tiny_run_prints_every_method_and_unit(tmp_path, capsys):
    out = tmp_path / "sweep.json"
    argv = ["--model", "tiny-llama", "--layer-step", "2", "--units", "FE[-1],LT"]
    assert main([*argv, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "new/floor" in text and "sweep: old" in text
    record = json.loads(out.read_text())
    assert {(c["method"], c["unit"]) for c in record["cells"]} == {
        (m, u) for m in ("weights", "activation", "residual") for u in ("FE[-1]", "LT")
    }
    assert all(c["max_abs_diff"] <= 1e-5 for c in record["cells"])
    assert all(c["floor_s"] > 0 for c in record["cells"])


def test_e7_is_timed_at_its_position_sets(tmp_path, capsys):
    out = tmp_path / "e7.json"
    argv = ["--model", "tiny-llama", "--layer-step", "1", "--methods", "e7"]
    assert main([*argv, "--json", str(out)]) == 0
    cells = json.loads(out.read_text())["cells"]
    assert [(c["method"], c["unit"], c["rows"]) for c in cells] == [
        ("e7", unit, 4) for unit in ("FE", "LT", "FE+LT")
    ]
    assert all(c["max_abs_diff"] <= 1e-5 and c["floor_s"] > 0 for c in cells)
