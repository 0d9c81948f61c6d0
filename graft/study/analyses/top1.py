"""The kinds of a run's top-1 tokens (:mod:`graft.results.top1_kinds`) against the names of
the dataset each row's prompt came from, written into the run folder as ``top1_kinds``."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from graft.results.folder import RunFolder
from graft.results.record import RunRecord
from graft.results.top1_kinds import top1_kinds
from graft.study.data.articles import article_names
from graft.study.data.datasets import load_facts
from graft.study.specs.run import RunSpecs

#: The table's stem in the run folder (``.parquet`` and ``.csv``).
TOP1_KINDS = "top1_kinds"


def _dataset_paths(record: RunRecord) -> dict[int, Path]:
    """Data seed -> the folder of the dataset its test prompts came from."""
    paths = {r.data_seed: r.dataset for r in record.replicates if r.dataset is not None}
    if paths or record.dataset is None:
        return paths
    run = RunSpecs.from_record(dict(record.options))  # the record read back into the run's specs
    return {run.data.data_seed: record.dataset}


def group_columns(examples: pl.DataFrame) -> list[str]:
    """The columns a run's top-1 kinds are grouped by: the replicate columns that vary, the
    graft group when there are several, then template and graft."""

    def varies(column: str) -> bool:
        return column in examples.columns and examples[column].n_unique() > 1

    replicate = [c for c in ("data_seed", "finetune_seed") if varies(c)]
    return [*replicate, "template", *(["group"] if varies("group") else []), "graft"]


def run_top1_kinds(examples: pl.DataFrame, record: RunRecord) -> pl.DataFrame:
    """Top-1 kinds per group (:func:`group_columns`) of a run's ``examples``, each data seed's
    rows classified against every actor (first and second) and title of its own dataset."""
    by = group_columns(examples)
    parts = []
    for seed, path in _dataset_paths(record).items():
        rows = examples.filter(pl.col("data_seed") == seed)
        if rows.height and not (path / "facts.jsonl").is_file():  # an articles dataset
            parts.append(top1_kinds(rows, article_names(path), set(), by=by))
        elif rows.height:
            facts = load_facts(path)
            actors = {f.first_actor for f in facts} | {f.second_actor for f in facts}
            parts.append(top1_kinds(rows, actors, {f.movie_title for f in facts}, by=by))
    return pl.concat(parts)


def write_top1_kinds(folder: RunFolder, examples: pl.DataFrame, record: RunRecord) -> pl.DataFrame:
    """Write ``top1_kinds.parquet`` (with its metadata) and ``.csv`` into ``folder``; return
    the table."""
    table = run_top1_kinds(examples, record)
    folder.write_summary(table, stem=TOP1_KINDS)
    return table
