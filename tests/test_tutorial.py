"""notebooks/tutorial.ipynb: stored with the outputs and plots of a run on SmolLM2-135M and
the main job's donor (so it renders where the repository is browsed), and run from top to
bottom in a Jupyter kernel (nbclient) on the tiny random pair (`GRAFT_TUTORIAL_MODELS=tiny`),
so the tutorial never rots; the tiny run's numbers are checked for shape and sense only.

To store the outputs again after an edit (about 2-3 minutes on a 2-core CPU, with the main
job's donor in ./workspace), from the repository root:

    .venv/bin/python -c "import nbformat; from nbclient import NotebookClient; \\
    p = 'notebooks/tutorial.ipynb'; nb = nbformat.read(p, 4); \\
    NotebookClient(nb, timeout=1800, resources={'metadata': {'path': 'notebooks'}}).execute(); \\
    nbformat.write(nb, p)"
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "tutorial.ipynb"


def _code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def _has_image(cell) -> bool:
    return any("image/png" in o.get("data", {}) for o in cell.get("outputs", []))


def _plots(cell) -> bool:
    return "plt.show()" in cell.source


def test_the_stored_notebook_shows_a_real_run_with_its_plots():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    cells = _code_cells(nb)
    assert all(c.get("outputs") for c in cells), "every code cell stores its output"
    assert not [o for c in cells for o in c.outputs if o.output_type == "error"]
    plot_cells = [c for c in cells if _plots(c)]
    assert len(plot_cells) >= 4  # the lens, the patch, the attribution, the graft attribution
    assert all(_has_image(c) for c in plot_cells)
    assert not [c for c in cells if _has_image(c) and not _plots(c)]
    first = "".join(o.get("text", "") for o in cells[0].outputs)
    assert "models: real, 30 layers" in first  # SmolLM2-135M, not the tiny pair
    # numbered in run order: the stored outputs are one run from top to bottom
    assert [c.execution_count for c in cells] == list(range(1, len(cells) + 1))
    assert NOTEBOOK.stat().st_size < 400_000


def test_every_section_names_its_measure():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    sections = [c.source for c in nb.cells if c.source.startswith("## ")]
    numbered = [s for s in sections if s[3].isdigit()]
    assert len(numbered) == 6
    assert all("*Measure" in s for s in numbered)


@pytest.mark.slow
def test_the_tutorial_runs_top_to_bottom_on_the_tiny_pair(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("GRAFT_TUTORIAL_MODELS", "tiny")
    monkeypatch.delenv("MPLBACKEND", raising=False)  # CI's Agg would keep the plots off the page
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in _code_cells(nb):
        cell.outputs = []
    nb.cells.append(
        nbformat.v4.new_code_cell(
            "import json\nprint(json.dumps({'lens': {k: list(v['rank'].shape) for k, v in "
            "lens_runs.items()}, 'patch': list(patch['logprob'].shape), 'attribution': "
            "{k: list(v.shape) for k, v in attr.items()}, 'texts': out.texts, "
            "'n_layers': n_layers, 'n_prompts': len(texts), 'models': MODELS, "
            "'graft_cells': len(cells), 'checked': len(checked), 'checked_r': float(r), 'agreement': "
            "{m: float(torch.corrcoef(torch.stack([attr[m].flatten(), "
            "patch_change[m].flatten()]))[0, 1]) for m in attr}}))"
        )
    )
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    result = json.loads(nb.cells[-1].outputs[0]["text"])
    layers, prompts = result["n_layers"], result["n_prompts"]
    assert result["models"] == "tiny"
    assert result["lens"] == {name: [prompts, layers + 1] for name in ("PRE", "FE+LT", "SFT")}
    assert result["patch"] == [prompts, layers]
    assert result["attribution"] == {"logprob": [prompts, layers], "logit": [prompts, layers]}
    assert len(result["texts"]) == 3
    # the graft attribution: every (prompt, layer, FE/LT, qkv/o/mlp) cell, 3 per prompt checked
    assert result["graft_cells"] == prompts * layers * 2 * 3
    assert result["checked"] == 3 * prompts and result["checked_r"] > 0.9, result["checked_r"]
    # on the tiny pair a patch is a small change: the first-order estimate must track it
    assert all(r > 0.9 for r in result["agreement"].values()), result["agreement"]
    plot_cells = [c for c in _code_cells(nb) if _plots(c)]
    assert len(plot_cells) >= 3 and all(_has_image(c) for c in plot_cells)
