"""Prose numbers from files (benchmarks.prose): the README's findings are rendered from a
template over results/, so a changed digit in a bullet fails ``results_tables --check``."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from benchmarks import prose, results_tables
from benchmarks.table_generators import BlockError

ROOT = Path(__file__).resolve().parents[2]


def _findings_block(text: str) -> str:
    start = text.index("<!-- results-table: prose readme-findings -->")
    end = text.index("<!-- /results-table -->", start)
    return text[start:end] + "<!-- /results-table -->\n"


def test_a_changed_digit_in_a_readme_bullet_fails_the_check(tmp_path):
    # the README's findings block alone (the tables around it have their own test)
    doc = tmp_path / "README.md"
    block = _findings_block((ROOT / "README.md").read_text())
    doc.write_text(block)
    assert results_tables.check([doc]) == []
    # the patching bullet's "acc@5 there 0.51" (SmolLM2, residual LT, first layer >= half)
    assert "acc@5 there 0.51" in block
    doc.write_text(block.replace("acc@5 there 0.51", "acc@5 there 0.61"))
    (difference,) = results_tables.check([doc])
    assert "prose readme-findings" in difference.block.spec
    added = [line for line in difference.diff().splitlines() if line.startswith("+ ")]
    assert any("acc@5 there 0.51" in line for line in added), difference.diff()
    # numbers across the block: each changed digit is caught
    numbers = list(re.finditer(r"\d\.\d\d", block))
    assert len(numbers) > 30
    for match in numbers[5::12]:
        doc.write_text(block[: match.start()] + "9.99" + block[match.end() :])
        assert results_tables.check([doc]), match.group()


def _template(tmp_path: Path, body: str, sources: str = "A = results/smollm2-cpu-seeds012") -> Path:
    path = tmp_path / "t.md"
    path.write_text(f"{sources}\n---\n{body}\n")
    return path


def test_placeholders_read_one_row_format_and_name_their_folders(tmp_path):
    text, folders = prose.render_template(
        _template(
            tmp_path,
            '- FE+LT {{ val("A/position_summary", "acc@5", graft="FE+LT", template="headline", '
            'n_seeds=3) | .2f }} (seeds {{ each(val("A/position_summary", "acc@5_per_seed", '
            'graft="FE+LT", template="headline", n_seeds=3)) }}), {{ p(0.0494) }}, '
            "{{ 131502.5 | num }} and {{ 30435.0 | num }}",
        )
    )
    assert text == "- FE+LT 0.81 (seeds 0.86 / 0.78 / 0.80), p = 0.049, 131,502.5 and 30,435"
    assert folders == [ROOT / "results" / "smollm2-cpu-seeds012"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('{{ val("A/position_summary", "acc@5", graft="FE+LT") | .2f }}', "rows of"),
        ('{{ val("A/nothing", "acc@5") | .2f }}', "no results/smollm2-cpu-seeds012/nothing.csv"),
        ('{{ val("Z/position_summary", "acc@5") }}', "unknown source 'Z'"),
        ("{{ 0.5 }}", "add ' | FORMAT'"),
        ("{{ open('x') }}", "NameError"),
        ('{{ check("A", "Fig. 9: nothing").verdict }}', "no check 'Fig. 9: nothing' on A"),
    ],
)
def test_a_bad_placeholder_is_one_error_naming_it(tmp_path, body, message):
    with pytest.raises(BlockError, match=re.escape(message)):
        prose.render_template(
            _template(tmp_path, body, "A = results/smollm2-cpu-seeds012 smollm2-135m")
        )


def test_a_template_needs_its_sources_line(tmp_path):
    path = tmp_path / "t.md"
    path.write_text("no sources\n")
    with pytest.raises(BlockError, match="the sources end with a line '---'"):
        prose.render_template(path)
    with pytest.raises(BlockError, match="no folder results/none"):
        prose.render_template(_template(tmp_path, "x", "A = results/none"))


def test_paragraphs_bullets_and_code_blocks_keep_their_shape(tmp_path):
    body = "one\ntwo\n\n- a\n  b\n- c\n\n    bash  scripts/setup.sh\n\nlast {{ 0.000492 | sci }}"
    text, _ = prose.render_template(_template(tmp_path, body))
    assert text == "one two\n\n- a b\n- c\n\n    bash  scripts/setup.sh\n\nlast 4.9e-4"


def test_an_inline_block_is_the_text_alone_and_a_changed_digit_fails(tmp_path):
    # the README's opening: prose between its markers, no blank lines or sources line
    text = (ROOT / "README.md").read_text()
    start = text.index("<!-- results-table: prose readme-intro inline=yes -->")
    end = text.index("<!-- /results-table -->", start)
    block = text[start:end] + "<!-- /results-table -->\n"
    assert block.splitlines()[1].startswith("Where does")
    assert "Generated from" not in block
    doc = tmp_path / "README.md"
    doc.write_text(block)
    assert results_tables.check([doc]) == []
    # the float64 bound (the norms in float64: the folder whose rows say "in dtype")
    assert "1.8e-12" in block
    doc.write_text(block.replace("1.8e-12", "2.0e-6"))
    assert results_tables.check([doc])
    doc.write_text(block.replace("inline=yes", "inline=no"))
    with pytest.raises(BlockError, match="inline takes yes"):
        results_tables.check([doc])


def test_json_reads_a_folders_json_file_and_names_it_and_sum_adds(tmp_path):
    # a donor's training log (the gentle preset's seeds): its fields, and a sum over them
    text, folders = prose.render_template(
        _template(
            tmp_path,
            '{{ json("E/finetune_log_seed1")["global_step"] | num }} steps, '
            '{{ sum([json("E/finetune_log_seed%d" % s)["global_step"] for s in (1, 2)]) | num }}',
            "E = results/smollm2-cpu-gentle-seeds012",
        )
    )
    assert text == "2,400 steps, 4,800"
    assert folders == [ROOT / "results" / "smollm2-cpu-gentle-seeds012"]
    with pytest.raises(
        BlockError, match=re.escape("no results/smollm2-cpu-gentle-seeds012/none.json")
    ):
        prose.render_template(
            _template(
                tmp_path, '{{ json("E/none")["x"] }}', "E = results/smollm2-cpu-gentle-seeds012"
            )
        )


def _table_folder(tmp_path: Path, name: str, csv: str) -> Path:
    """A made-up results folder holding one table ``name`` with the text ``csv``."""
    folder = tmp_path / "attr"
    folder.mkdir()
    (folder / name).write_text(csv)
    return folder


def test_pooled_scores_verified_attribution_cells_taken_together(tmp_path):
    # a made-up verify table: Pearson over all cells, sign agreement over the moving ones
    folder = _table_folder(
        tmp_path,
        "attribution_verify.csv",
        "prompt,layer,unit,kind,estimate,real\n"
        "0,0,FE,q,1.0,2.0\n0,1,FE,q,2.0,4.0\n0,0,LT,mlp,3.0,6.5\n0,1,LT,mlp,-0.5,0.01\n",
    )
    body = (
        '{{ pooled(rows("A/attribution_verify"))["pearson"] | .3f }} '
        '{{ pooled(rows("A/attribution_verify"))["sign_agreement"] | .2f }} '
        '{{ pooled(rows("A/attribution_verify"))["moving"] }} '
        '{{ pooled(rows("A/attribution_verify", unit="FE"))["cells"] }}'
    )
    expected = np.corrcoef([1.0, 2.0, 3.0, -0.5], [2.0, 4.0, 6.5, 0.01])[0, 1]
    text, _ = prose.render_template(_template(tmp_path, body, f"A = {folder}"))
    # the near-zero cell (0.01 < 5% of 6.5) does not count for signs: 3 of 3 agree
    assert text == f"{expected:.3f} 1.00 3 2"
    with pytest.raises(BlockError, match=re.escape("pooled() of no rows")):
        prose.render_template(
            _template(
                tmp_path,
                '{{ pooled(rows("A/attribution_verify", unit="none"))["cells"] }}',
                f"A = {folder}",
            )
        )


def test_means_average_a_column_per_group_in_order_of_appearance(tmp_path):
    folder = _table_folder(
        tmp_path,
        "attribution_estimates.csv",
        "prompt,layer,unit,kind,estimate\n"
        "0,1,LT,mlp,1.0\n0,0,LT,mlp,2.0\n1,1,LT,mlp,3.0\n1,0,LT,mlp,-4.0\n0,1,FE,o,0.5\n",
    )
    body = (
        '{{ ", ".join(["{}:{}:{} {:.2f}".format(c["unit"], c["kind"], c["layer"], c["estimate"]) '
        'for c in means(rows("A/attribution_estimates"), "estimate", "unit", "kind", "layer")]) }}'
    )
    text, _ = prose.render_template(_template(tmp_path, body, f"A = {folder}"))
    assert text == "LT:mlp:1 2.00, LT:mlp:0 -1.00, FE:o:1 0.50"


def test_a_changed_digit_in_the_attribution_pages_prose_fails_the_check(tmp_path):
    # the pooled Pearson over every cell, computed from attribution_verify.csv
    text = (ROOT / "docs" / "results" / "attribution.md").read_text()
    start = text.index("<!-- results-table: prose attribution-singles -->")
    end = text.index("<!-- /results-table -->", start)
    block = text[start:end] + "<!-- /results-table -->\n"
    doc = tmp_path / "attribution.md"
    doc.write_text(block)
    assert results_tables.check([doc]) == []
    found = re.search(r"Over all 1,260 cells Pearson is (\d\.\d{3})", block)
    assert found, block
    changed = found.group(0)[:-1] + str((int(found.group(0)[-1]) + 1) % 10)
    doc.write_text(block.replace(found.group(0), changed))
    (difference,) = results_tables.check([doc])
    assert "prose attribution-singles" in difference.block.spec
