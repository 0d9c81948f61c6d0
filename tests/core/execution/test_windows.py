"""Rows from their first changed column (graft.core.execution.windows): which column each
row starts at. The windows' numbers against the whole forward and the reference are checked
with the resumed sweeps (tests/core/execution/test_resume.py, tests/study/test_patching.py)."""

from __future__ import annotations

from graft.core.execution import windows
from tests.core.execution.test_resume import patch


def test_each_rows_first_changed_column():
    patches = [
        patch("model.layers.2.mlp.down_proj", [[0, 0, 1], [0, 0, 0], [0, 1, 1], [0, 0, 0]]),
        patch("model.layers.1.self_attn.o_proj", [[0, 0, 0], [0, 0, 1], [1, 0, 0], [0, 0, 0]]),
        patch("lm_head", [[0], [0], [0], [1]]),  # the head under logits_to_keep: last column
    ]
    assert windows.first_changed_columns(patches, 4, 3).tolist() == [2, 2, 0, 2]
