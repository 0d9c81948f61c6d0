"""The contrast table reads position and component contrasts, never necessity's."""

from __future__ import annotations

import polars as pl

from benchmarks import contrast_table


def _row(template, a, b, diff):
    return {
        "template": template,
        "graft_a": a,
        "graft_b": b,
        "acc@5_diff": diff,
        "acc@5_diff_lo": diff - 0.1,
        "acc@5_diff_hi": diff + 0.1,
        "mcnemar_p_holm": 0.01234,
        "target_logprob_diff": 2.0,
    }


def test_table_reads_position_and_component_files(tmp_path):
    pl.DataFrame([_row("qa", "FE+LT", "SFT", -0.1)]).write_csv(tmp_path / "position_contrasts.csv")
    pl.DataFrame([_row("qa", "O+FFN", "FFN", 0.05)]).write_csv(tmp_path / "component_contrasts.csv")
    pl.DataFrame([_row("qa", "FE+LT", "SFT", -0.9)]).write_csv(tmp_path / "necessity_contrasts.csv")
    text = contrast_table.table([("run", tmp_path)])
    lines = text.splitlines()
    assert len(lines) == 4  # header, rule, two contrasts
    assert "| run | FE+LT vs SFT | — | -0.10 [-0.20, +0.00] p=0.012; +2.0 nats | — |" in lines
    assert "O+FFN vs FFN" in lines[3] and "-0.90" not in text


def test_usage_error_is_exit_2(capsys):
    assert contrast_table.main(["no-label"]) == 2
    assert "usage" in capsys.readouterr().err
