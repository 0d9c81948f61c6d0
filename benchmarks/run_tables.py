"""Table makers of the ``results-table`` markers that show a run's per-seed values, several
metrics side by side, the kinds of its top-1 tokens and its top tokens: ``seeds``,
``metrics``, ``kinds`` and ``examples`` (registered in
:data:`benchmarks.table_generators.GENERATORS`)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from benchmarks._graft_api import provenance_entries, read_csv_table
from benchmarks.md_table import md_table
from benchmarks.summary_table import template_order
from benchmarks.table_generators import (
    BlockError,
    _experiment_order,
    _files_in,
    _float_format,
    _keyword,
    _one_file,
    generator,
    shown,
)

#: the columns of a ``top1_kinds.csv`` in the order the tables show them, with their headers
KINDS = (
    ("actor", "actor"),
    ("actor_or_title", "actor or title"),
    ("title", "title"),
    ("punct_function", "punctuation or function word"),
    ("other", "other"),
)


def _order(keywords: dict[str, str], present: list[str], folders: list[Path], experiment: str):
    if "grafts" in keywords:
        order = keywords["grafts"].split(",")
    else:
        order = next((o for f in folders if (o := _experiment_order(f, experiment))), None)
    return [g for g in (order or present) if g in set(present)]


def _recorded_seeds(folder: Path, experiment: str = "position") -> list[int]:
    """The finetune seeds ``folder``'s provenance records for ``experiment`` (none: [])."""
    entry = dict(provenance_entries(folder)).get(experiment) or {}
    listed = (entry.get("seeds") or {}).get("finetune_seeds")
    if listed:
        return [int(s) for s in listed]
    # a run of one finetune: the seed its donors were trained with
    donors = (entry.get("finetuned_models") or {}).values()
    return sorted({int(d["seed"]) for d in donors if d.get("seed") is not None})


def _per_seed_rows(path: Path) -> pl.DataFrame:
    """The rows of one finetune seed each (a pooled row over seeds dropped)."""
    summary = read_csv_table(path)
    if "n_seeds" in summary.columns:
        summary = summary.filter(pl.col("n_seeds").fill_null(1) <= 1)
    if "finetune_seed" not in summary.columns:
        raise BlockError(f"{shown(path)} has no finetune_seed column")
    return summary.filter(pl.col("finetune_seed").is_not_null())


@generator(
    "seeds",
    "seeds FOLDER ... [experiment=position] [metric=acc@5] [minus=GRAFT] [format=.2f] "
    "[grafts=A,B,...]: grafts x templates, each cell the metric per finetune seed (of every "
    "FOLDER, in seed order) and their mean in parentheses; minus= shows each seed's difference "
    "from that graft's value",
    ("experiment", "metric", "minus", "format", "grafts"),
)
def _seeds(positional: list[str], keywords: dict[str, str]) -> tuple[str, list[Path]]:
    experiment = keywords.get("experiment", "position")
    metric = keywords.get("metric", "acc@5")
    form = _float_format("format", keywords.get("format", "+.2f" if "minus" in keywords else ".2f"))
    files = _files_in(positional, f"{experiment}_summary.csv")
    folders = [file.parent for file in files]
    rows = pl.concat([_per_seed_rows(f) for f in files], how="diagonal_relaxed")
    if metric not in rows.columns:
        raise BlockError(f"{experiment}_summary.csv has no metric {metric!r}")
    rows = rows.with_columns(pl.col("finetune_seed").cast(pl.Int64))
    seeds = sorted(set(rows["finetune_seed"]))
    if rows.select("template", "graft", "finetune_seed").is_duplicated().any():
        raise BlockError(f"a finetune seed appears twice among {', '.join(map(shown, folders))}")
    minus = keywords.get("minus")
    present = list(dict.fromkeys(rows["graft"]))
    if minus is not None and minus not in present:
        raise BlockError(f"minus={minus}: no such graft")
    order = [g for g in _order(keywords, present, folders, experiment) if g != minus]
    templates = template_order(rows)

    def values(graft: str, template: str) -> list[float] | None:
        part = rows.filter((pl.col("graft") == graft) & (pl.col("template") == template))
        if part.is_empty():
            return None
        by_seed = dict(zip(part["finetune_seed"], part[metric], strict=True))
        if set(by_seed) != set(seeds):
            raise BlockError(f"{graft} on {template} lacks finetune seeds")
        return [by_seed[s] for s in seeds]

    def cell(graft: str, template: str) -> str:
        got = values(graft, template)
        if got is None:
            return "—"
        if minus is not None:
            base = values(minus, template)
            if base is None:
                raise BlockError(f"no {minus} row on {template}")
            got = [g - b for g, b in zip(got, base, strict=True)]
        mean = sum(got) / len(got)
        each = " / ".join(format(v, form) for v in got)
        return each if len(got) == 1 else f"{each} ({format(mean, form)})"

    body = ([graft, *(cell(graft, t) for t in templates)] for graft in order)
    return md_table(["graft", *templates], body), files


@generator(
    "metrics",
    "metrics FOLDER metrics=A,B,... [experiment=position] [formats=.2f,.1f,...] "
    "[grafts=A,B,...]: one finetune's grafts x metrics, each cell the metric on every template "
    "(headline / qa / movie)",
    ("metrics", "experiment", "formats", "grafts"),
)
def _metrics(positional: list[str], keywords: dict[str, str]) -> tuple[str, list[Path]]:
    if "metrics" not in keywords:
        raise BlockError("metrics needs metrics=")
    experiment = keywords.get("experiment", "position")
    path = _one_file("metrics", positional, f"{experiment}_summary.csv")
    folder = path.parent
    rows = _per_seed_rows(path)
    if len(set(rows["finetune_seed"])) != 1:
        raise BlockError(f"{shown(path)} holds several finetune seeds: use seeds or summary")
    metrics = keywords["metrics"].split(",")
    if missing := [m for m in metrics if m not in rows.columns]:
        raise BlockError(f"{shown(path)} has no metric {', '.join(missing)}")
    forms = [
        _float_format("formats", f)
        for f in keywords.get("formats", ",".join(".2f" for _ in metrics)).split(",")
    ]
    if len(forms) != len(metrics):
        raise BlockError(f"{len(forms)} formats for {len(metrics)} metrics")
    templates = template_order(rows)
    order = _order(keywords, list(dict.fromkeys(rows["graft"])), [folder], experiment)
    shown_templates = " / ".join(templates)

    def value(graft: str, template: str, metric: str, form: str) -> str:
        row = rows.filter((pl.col("graft") == graft) & (pl.col("template") == template))
        return "—" if row.is_empty() else format(row[metric][0], form)

    def cell(graft: str, metric: str, form: str) -> str:
        return " / ".join(value(graft, t, metric, form) for t in templates)

    head = ["graft", *(f"{m} {shown_templates}" for m in metrics)]
    pairs = list(zip(metrics, forms, strict=True))
    body = ([graft, *(cell(graft, m, f) for m, f in pairs)] for graft in order)
    return md_table(head, body), [path]


@generator(
    "kinds",
    "kinds FOLDER [template=T] [finetune_seed=S] [grafts=A,B,...]: the kinds of the top-1 "
    "tokens (FOLDER/top1_kinds.csv), rows of each kind out of n; with template=, grafts x "
    "kinds on that template with each finetune seed's count; without it, grafts x templates "
    "for one finetune seed, each cell the counts of every kind",
    ("template", "finetune_seed", "grafts"),
)
def _kinds(positional: list[str], keywords: dict[str, str]) -> tuple[str, list[Path]]:
    path = _one_file("kinds", positional, "top1_kinds.csv")
    folder = path.parent
    rows = read_csv_table(path)
    if "finetune_seed" not in rows.columns:  # a run of one finetune: its seed is recorded
        recorded = _recorded_seeds(folder)
        if len(recorded) != 1:
            raise BlockError(f"{shown(path)} has no finetune_seed column and no one recorded seed")
        rows = rows.with_columns(pl.lit(recorded[0]).alias("finetune_seed"))
    rows = rows.with_columns(pl.col("finetune_seed").cast(pl.Int64))
    seeds = sorted(set(rows["finetune_seed"]))
    if "finetune_seed" in keywords:
        seed = _keyword(keywords, "finetune_seed", int, "not a number")
        if seed not in seeds:
            raise BlockError(f"{shown(path)} has no finetune seed {seed} (it has {seeds})")
        rows, seeds = rows.filter(pl.col("finetune_seed") == seed), [seed]
    order = _order(keywords, list(dict.fromkeys(rows["graft"])), [folder], "position")

    def count(graft: str, template: str, kind: str, seed: int) -> int | None:
        row = rows.filter(
            (pl.col("graft") == graft)
            & (pl.col("template") == template)
            & (pl.col("kind") == kind)
            & (pl.col("finetune_seed") == seed)
        )
        return None if row.is_empty() else int(row["count"][0])

    n = sorted(set(rows["n"]))
    if "template" in keywords:
        template = keywords["template"]
        if template not in set(rows["template"]):
            raise BlockError(f"{shown(path)} has no template {template}")
        per = " / ".join(f"seed {s}" for s in seeds)
        head = [f"graft (of {'/'.join(map(str, n))} rows, {per})", *(h for _, h in KINDS)]
        body = []
        for graft in order:
            cells = []
            for kind, _ in KINDS:
                got = [count(graft, template, kind, s) for s in seeds]
                cells.append("—" if None in got else " / ".join(map(str, got)))
            if set(cells) != {"—"}:  # a graft the template has no row of (M on qa)
                body.append([graft, *cells])
        return md_table(head, body, right=len(KINDS)), [path]
    if len(seeds) != 1:
        raise BlockError(f"{shown(path)} holds finetune seeds {seeds}: name one (finetune_seed=)")
    templates = template_order(rows)
    kinds = " / ".join(h for _, h in KINDS)
    head = [f"graft ({kinds}, of {'/'.join(map(str, n))} rows)", *templates]

    def cell(graft: str, template: str) -> str:
        got = [count(graft, template, kind, seeds[0]) for kind, _ in KINDS]
        return "—" if None in got else " / ".join(map(str, got))

    body = ([graft, *(cell(graft, t) for t in templates)] for graft in order)
    return md_table(head, body, right=len(templates)), [path]


@generator(
    "examples",
    "examples FOLDER [file=tokens_paper_top_tokens.csv] [k=3]: the first example of each "
    "template in FOLDER's top-tokens table, each graft's top k next tokens with their "
    "probabilities and the target's rank (0 = top)",
    ("file", "k"),
)
def _examples(positional: list[str], keywords: dict[str, str]) -> tuple[str, list[Path]]:
    path = _one_file("examples", positional, keywords.get("file", "tokens_paper_top_tokens.csv"))
    k = _keyword(keywords, "k", int, "not a whole number", "3")
    rows = read_csv_table(path)
    need = {"template", "graft", "prompt_id", "rank", "token", "prob", "target_rank", "text"}
    if missing := sorted(need - set(rows.columns)):
        raise BlockError(f"{shown(path)} lacks the columns {', '.join(missing)}")
    body = []
    for template in template_order(rows):
        part = rows.filter(pl.col("template") == template)
        example = part.filter(pl.col("prompt_id") == part["prompt_id"][0])
        first = example.row(0, named=True)
        target = f' ("{first["target_text"]}")' if "target_text" in example.columns else ""
        label = f'"{first["text"]}"{target}'
        for graft in dict.fromkeys(example["graft"]):
            top = example.filter(pl.col("graft") == graft).sort("rank").head(k)
            tokens = ", ".join(
                f'"{t}" {p:.2f}' for t, p in zip(top["token"], top["prob"], strict=True)
            )
            body.append([label, graft, tokens, str(top["target_rank"][0])])
            label = ""
    head = ["prompt (target)", "graft", f"top {k} next tokens (probability)", "target rank"]
    return md_table(head, body, right=1), [path]
