"""notebooks/tutorial.ipynb runs from top to bottom in a Jupyter kernel (nbclient), on the
tiny pair it uses by default, so the tutorial never rots; its numbers are checked for shape
and sense here, not against stored outputs (the notebook is stored without outputs)."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "tutorial.ipynb"


def test_the_notebook_is_stored_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")


@pytest.mark.slow
def test_the_tutorial_runs_top_to_bottom(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells.append(
        nbformat.v4.new_code_cell(
            "import json\nprint(json.dumps({'lens': lens, 'attribution': attribution, "
            "'texts': out.texts, 'n_layers': n_layers}))"
        )
    )
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    last = nb.cells[-1].outputs[0]["text"]
    result = json.loads(last)
    assert set(result["lens"]) == {"none", "FE+LT:all:all"}
    assert all(len(r) == result["n_layers"] + 1 for r in result["lens"].values())
    assert len(result["attribution"]) == result["n_layers"] and len(result["texts"]) == 2
