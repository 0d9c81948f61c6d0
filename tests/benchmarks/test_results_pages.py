"""The results section (benchmarks.results_pages): one page per study under docs/results/,
each naming the results/ folders it reads, and an index that covers every folder."""

from __future__ import annotations

import pytest

from benchmarks import results_pages
from benchmarks.results_tables import GENERATORS, BlockError

STUDY = "<!-- results-table: study{} -->\n<!-- /results-table -->\n"
CSV = "<!-- results-table: csv results/{} file=t.csv -->\n<!-- /results-table -->\n"


def test_every_folder_of_results_is_on_a_study_page_that_names_it():
    """Each study page has its study block, naming exactly the folders its tables and prose
    read, and every folder of results/ is read by some page: a folder published without a
    page, or a table added without its run, fails here (and in ``--check``)."""
    covered = set()
    pages = results_pages.study_pages()
    assert len(pages) >= 10
    for page in pages:
        named, read = results_pages.page_folders(page)
        assert named is not None, f"{page.name}: no study block under its title"
        assert sorted(set(named)) == sorted(read), page.name
        covered.update(named)
    folders = {f"results/{p.name}" for p in results_pages.RESULTS.iterdir() if p.is_dir()}
    assert folders <= covered, sorted(folders - covered)
    index = (results_pages.PAGES / "index.md").read_text()
    assert "<!-- results-table: studies -->" in index
    assert all(f"]({page.name})" in index for page in pages)


def _section(tmp_path, monkeypatch, pages: dict[str, str], folders: list[str]):
    docs, results = tmp_path / "docs" / "results", tmp_path / "results"
    docs.mkdir(parents=True)
    results.mkdir()
    for name, text in pages.items():
        (docs / name).write_text(text)
    for name in folders:
        (results / name).mkdir()
    monkeypatch.setattr(results_pages, "PAGES", docs)
    monkeypatch.setattr(results_pages, "RESULTS", results)


def test_a_folder_on_no_page_is_an_error(tmp_path, monkeypatch):
    _section(tmp_path, monkeypatch, {"a.md": "# A\n\n" + STUDY.format("")}, ["orphan"])
    with pytest.raises(BlockError, match="results/orphan: on no page of docs/results/"):
        GENERATORS["studies"].make([], {})


def test_a_study_block_must_name_what_its_page_reads(tmp_path, monkeypatch):
    page = "# A\n\n" + STUDY.format("") + "\n" + CSV.format("y")
    _section(tmp_path, monkeypatch, {"a.md": page}, ["y"])
    with pytest.raises(BlockError, match="must name the folders the page reads; add results/y"):
        GENERATORS["studies"].make([], {})


def test_a_page_without_its_study_block_is_an_error(tmp_path, monkeypatch):
    _section(tmp_path, monkeypatch, {"a.md": "# A\n\n" + CSV.format("y")}, ["y"])
    with pytest.raises(BlockError, match="has no study block"):
        GENERATORS["studies"].make([], {})


def test_a_study_without_folders_says_where_its_numbers_come_from():
    text, sources = GENERATORS["study"].make([], {})
    assert "no folder of `results/`" in text and "HISTORY.md" in text and sources == []


def test_prose_templates_count_as_what_a_page_reads(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# P\n\n<!-- results-table: prose patching-smollm2-restore -->\nx\n")
    named, read = results_pages.page_folders(page)
    assert named is None and read == ["results/smollm2-cpu-patching-seed0"]
