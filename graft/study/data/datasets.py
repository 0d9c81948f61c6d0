"""A dataset folder: what to generate (:class:`DatasetConfig`), writing it, reading it back.

Generation is tokenizer-independent: test prompts are stored as text plus the character
span of each field, and :func:`graft.study.data.prompts.load_test_prompts` tokenizes them for a
given tokenizer. Every random choice is drawn from a generator seeded by
``DatasetConfig.seed``; the same config (and Faker version) gives byte-identical files.

Dataset folder (written to a temporary sibling folder and renamed into place):
``facts.jsonl``, ``train.jsonl``, ``test_prompts.jsonl``, ``corpus.jsonl`` (only with
``corpus_path``: generic text that finetuning mixes in) and ``manifest.json``, which
records the sha256 of every other file: the loaders check them (:func:`verify_dataset`), so
an edited or damaged file is refused, never used silently.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from dataclasses import asdict
from importlib.metadata import version
from pathlib import Path
from typing import Any

from graft.errors import DatasetError, StorageError
from graft.storage.files import atomic_folder, refuse_special_under
from graft.storage.locks import exclusive
from graft.study.data.articles import (
    ARTICLES_GENERATOR,
    ARTICLES_KIND,
    article_dataset,
    articles_dataset_name,
    check_articles_config,
)
from graft.study.data.dataset_folder import (
    CORPUS_FILE,
    check_dataset_folder,
    load_dataset_corpus,
    load_facts,
    load_manifest,
    load_train_records,
    verify_dataset,
)
from graft.study.data.facts import draw_facts
from graft.study.data.facts_file import facts_file_tag
from graft.study.data.files import jsonl_bytes, read_text_corpus
from graft.study.data.relation import (
    RELATION_GENERATOR,
    RELATION_KIND,
    relation_dataset,
    relation_dataset_name,
)
from graft.study.data.renderings import (
    render_test_prompts,
    render_training,
    renderings_per_fact,
)
from graft.study.specs.choices import DEFAULT_N_FACTS, KINDS
from graft.study.specs.config import SHUFFLES, DatasetConfig
from graft.study.specs.templates import DIRECTIONS

GENERATOR_VERSION = "graft.data/1"
#: The kinds whose texts are the user's (no Faker draws).
OWN_TEXT_KINDS = (ARTICLES_KIND, RELATION_KIND)


def generator_version(config: DatasetConfig) -> str:
    """The generator version a dataset of ``config`` records, and must match to be reused:
    :data:`GENERATOR_VERSION`, marked where the generator changed for a protocol or kind
    (paper-protocol datasets: the movie prompt's doubled "in", then five article and five
    QA renderings per fact and direction, no longer six and five; ``real_movies_shuffled``:
    ``shuffled-relations`` or ``shuffled-pairs``, its shuffle, so neither is taken for the
    other nor for the pair-keeping shuffle of the generator before them); ``articles`` has
    its own, and so has ``relation``."""
    if config.kind == ARTICLES_KIND:
        return ARTICLES_GENERATOR
    if config.kind == RELATION_KIND:
        return RELATION_GENERATOR
    changes = list(config.protocol.generator_tags) + (
        [f"shuffled-{config.shuffle}"] if config.kind == "real_movies_shuffled" else []
    )
    return "+".join([GENERATOR_VERSION, *changes])


#: The kinds made from an input file, and that file's field.
INPUT_FILES = {
    "custom": "facts_path",
    ARTICLES_KIND: "articles_path",
    RELATION_KIND: "relation_path",
}


def _check_input_file(config: DatasetConfig) -> None:
    """Refuse a config whose input files do not fit its kind: a kind made from a file
    (:data:`INPUT_FILES`) without it, a file of another kind, two files. The messages write
    fields as ``facts_path`` and the kind as ``kind='custom'``, so the command line says
    ``--facts`` and ``--dataset custom``."""
    given = [field for field in INPUT_FILES.values() if getattr(config, field) is not None]
    kind_of = {field: kind for kind, field in INPUT_FILES.items()}
    if len(given) > 1:
        raise DatasetError(
            f"{given[0]} and {given[1]} cannot go together (each makes its own kind of "
            f"dataset); drop one",
            given[1],
        )
    needed = INPUT_FILES.get(config.kind)
    other = given[0] if given and given[0] != needed else None
    if needed is not None and getattr(config, needed) is None:
        fix = f" and drop {other}, or use kind={kind_of[other]!r}" if other else ""
        raise DatasetError(
            f"kind={config.kind!r} is made from a file: set {needed}{fix}",
            "kind",
            params=("kind",),
        )
    if other is not None:
        raise DatasetError(
            f"{other} goes with kind={kind_of[other]!r} only: drop {other}, or use "
            f"kind={kind_of[other]!r}",
            other,
            params=("kind",),
        )


def validate_config(config: DatasetConfig) -> None:
    """Raise :class:`DatasetError` (with the option to fix) for a bad config."""
    if config.kind not in KINDS:
        raise DatasetError(
            f"unknown dataset kind {config.kind!r}; use one of {', '.join(KINDS)}", "kind"
        )
    if config.direction not in DIRECTIONS:
        raise DatasetError(
            f"direction must be 'one' or 'both', not {config.direction!r}", "direction"
        )
    _check_input_file(config)
    if config.kind == ARTICLES_KIND:
        check_articles_config(config)
    if config.kind == RELATION_KIND:
        check_articles_config(config, "relation_path")
    if config.n_facts is not None and config.n_facts < 1:
        raise DatasetError(f"n_facts must be at least 1, not {config.n_facts}", "n_facts")
    if config.shuffle not in SHUFFLES:
        raise DatasetError(
            f"shuffle must be {' or '.join(map(repr, SHUFFLES))}, not {config.shuffle!r}",
            "shuffle",
        )
    if config.shuffle != SHUFFLES[0] and config.kind != "real_movies_shuffled":
        raise DatasetError(
            f"shuffle {config.shuffle!r} goes with kind 'real_movies_shuffled' only; drop it "
            f"or choose that kind (kind here: {config.kind!r})",
            "shuffle",
        )
    if config.relations is not None and (
        not config.relations or any(len(r) != 3 or not all(r) for r in config.relations)
    ):
        raise DatasetError(
            "relations must be non-empty (relation, relation_preposition, preposition) triples",
            "relations",
        )


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _corpus_docs(config: DatasetConfig, sources: dict[str, Any]) -> list[str]:
    """The documents of ``config.corpus_path`` (none without one); records it in ``sources``."""
    if config.corpus_path is None:
        return []
    docs = read_text_corpus(config.corpus_path)
    if not docs:
        raise DatasetError(f"corpus {config.corpus_path} holds no documents", "corpus_path")
    sources["corpus_path"] = str(config.corpus_path)
    sources["corpus_sha256"] = _sha256(Path(config.corpus_path).read_bytes())
    return docs


def build_dataset(config: DatasetConfig) -> dict[str, bytes]:
    """Generate every file of a dataset in memory: file name -> bytes (no disk writes)."""
    validate_config(config)
    if config.kind == ARTICLES_KIND:
        files, entries = article_dataset(config)
    elif config.kind == RELATION_KIND:
        files, entries = relation_dataset(config)
    else:
        files, entries = _movie_dataset(config)
    docs = _corpus_docs(config, entries["sources"])
    if docs:
        files[CORPUS_FILE] = jsonl_bytes({"text": d} for d in docs)
    entries["sizes"]["corpus_docs"] = len(docs)
    manifest = {
        "generator_version": generator_version(config),
        **({} if config.kind in OWN_TEXT_KINDS else {"faker_version": version("faker")}),
        "config": config.to_json(),
        "kind": config.kind,
        "protocol": config.protocol.name,
        "seed": config.seed,
        "direction": config.direction,
        "split": config.split,
        **entries,
        "files": {name: _sha256(data) for name, data in files.items()},
    }
    files["manifest.json"] = (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode()
    return files


def _movie_dataset(config: DatasetConfig) -> tuple[dict[str, bytes], dict[str, Any]]:
    """The data files of a movie-fact dataset and its manifest's own entries."""
    drawn = draw_facts(config)
    facts, sources = drawn.facts, drawn.sources
    files: dict[str, bytes] = {"facts.jsonl": jsonl_bytes(asdict(f) for f in facts)}
    train = [r for f in facts for r in render_training(f, config.direction, config.texts)]
    files["train.jsonl"] = jsonl_bytes(train)
    test_set = "B" if config.split else "all"
    tests = [
        r
        for f in facts
        if f.set == test_set
        for r in render_test_prompts(f, config.relations, config.texts)
    ]
    files["test_prompts.jsonl"] = jsonl_bytes(tests)
    entries = {
        "sizes": {
            "facts": len(facts),
            "facts_per_set": dict(Counter(f.set for f in facts)),
            "train": len(train),
            "renderings_per_fact": renderings_per_fact(config),
            "test_prompts": len(tests),
        },
        "excluded_names": dict(sorted(drawn.excluded_names.items())),
        "dropped_rows": dict(sorted(drawn.dropped_rows.items())),
        "dropped_row_numbers": dict(sorted(drawn.dropped_row_numbers.items())),
        "templates": {
            "article": list(config.texts.article),
            "qa": list(config.texts.qa),
            "test": config.texts.test,
        },
        "test_set": test_set,
        "sources": sources,
    }
    if config.kind == "real_movies_shuffled":
        entries["shuffle"] = config.shuffle
    return files, entries


def generate_dataset(
    config: DatasetConfig,
    out_dir: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    lock_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Generate the dataset of ``config`` into ``out_dir`` and return its path.

    The files are built in memory, written to a temporary sibling folder and renamed into
    place, so an interrupted run leaves no half-written dataset. An existing dataset made
    from the same config is kept as it is (nothing regenerated); any other non-empty
    ``out_dir`` is an error unless ``overwrite``. With ``lock_dir`` (a workspace's locks),
    one process writes ``out_dir`` while others that ask for it wait, then use it
    (:func:`graft.storage.locks.exclusive`).

    Raises:
        DatasetError: bad config or input files; nothing is written.
        StorageError: ``out_dir`` cannot be written (a name too long, no permission, a full
            disk, ...), ``param`` ``"out"``; nothing is written.
        DamagedFileError: ``out_dir`` holds the dataset of ``config`` but a file of it was
            edited or damaged (and not ``overwrite``).
    """
    try:
        return _generate(config, Path(out_dir), overwrite, lock_dir)
    except OSError as err:
        raise StorageError(
            f"cannot write the dataset to {str(out_dir)[:200]}: {err.strerror or err}; "
            "choose another folder",
            param="out",
        ) from err


def _generate(
    config: DatasetConfig, out: Path, overwrite: bool, lock_dir: str | os.PathLike[str] | None
) -> Path:
    """:func:`generate_dataset` without its translation of disk errors."""
    if out.exists() and _reusable(out, config, overwrite):
        return out
    files = build_dataset(config)
    # one process writes ``out`` (job arrays on one workspace); the others wait and use it
    with exclusive(out, f"generating the dataset {out}", lock_dir):
        # checked again under the lock: another process may have written it meanwhile,
        # whether this one had to wait or came just after
        if out.exists() and _reusable(out, config, overwrite):
            return out
        return _write(files, out)


def _reusable(out: Path, config: DatasetConfig, overwrite: bool) -> bool:
    """Whether the existing ``out`` is the dataset of ``config`` (kept as it is); False for
    an empty folder or with ``overwrite``; refused when it holds anything else."""
    if out.is_dir() and not any(out.iterdir()):
        return False
    refuse_special_under(out)  # before anything in it is opened (a FIFO would hang)
    validate_config(config)
    if overwrite:
        return False
    if _made_from(out, config):
        verify_dataset(out)  # a damaged copy is no dataset of ``config``: never reused silently
        return True
    older = (out / "manifest.json").is_file() and load_manifest(out).get(
        "config"
    ) == config.to_json()
    why = (
        "was made by an older generator or from another version of its input file"
        if older
        else "already exists with other content"
    )
    raise DatasetError(f"{out} {why}; replace it (overwrite) or choose another folder", "out")


def _made_from(out: Path, config: DatasetConfig) -> bool:
    """Whether ``out`` holds the dataset of ``config`` made by this generator version."""
    if not (out / "manifest.json").is_file():
        return False
    existing = load_manifest(out)
    return (
        existing.get("config") == config.to_json()
        and existing.get("generator_version") == generator_version(config)
        and _inputs_unchanged(existing.get("sources", {}), config)
    )


def _inputs_unchanged(sources: dict[str, Any], config: DatasetConfig) -> bool:
    """Whether the input files a dataset was made from (the facts file, the corpus, the
    articles file, the relation file and its facts file) still hold what they held then (a
    file since removed: yes)."""
    inputs = [
        (getattr(config, f"{name}_path"), sources.get(f"{name}_sha256"))
        for name in ("facts", "corpus", "articles", "relation")
    ]
    inputs.append((sources.get("relation_facts_path"), sources.get("relation_facts_sha256")))
    for path, recorded in inputs:
        known = path is not None and recorded is not None and Path(path).is_file()
        if known and _sha256(Path(path).read_bytes()) != recorded:
            return False
    return True


def _write(files: dict[str, bytes], out: Path) -> Path:
    """``files`` into the folder ``out`` through a temporary sibling renamed into place."""
    with atomic_folder(out) as tmp:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
    return out


def default_dataset_name(config: DatasetConfig) -> str:
    """A folder name that spells out the config, e.g. ``fake_movies_real_actors-one-n50-seed0``
    (``fake_movies_real_actors-paper-one-n50-seed0`` under the paper protocol, so the two
    protocols' datasets, and the donors trained on them, never share a folder;
    ``real_movies_shuffled-pairs-one-n50-seed0`` for the pair-keeping shuffle;
    ``custom-1a2b3c4d-one-nall-seed0`` for a facts file, named by the start of its content's
    SHA-256, so two files never share a folder). Without
    ``n_facts``: ``nall`` for a custom file, ``npaper`` under the paper protocol (its 1,000
    facts, or the most the kind has), else ``n50``. An articles file's:
    :func:`~graft.study.data.articles.articles_dataset_name`; a relation file's:
    :func:`~graft.study.data.relation.relation_dataset_name`."""
    validate_config(config)  # before a name is read from the config's input file
    if config.kind == ARTICLES_KIND:
        return articles_dataset_name(config)
    if config.kind == RELATION_KIND:
        return relation_dataset_name(config)
    if config.n_facts is None and config.kind == "custom":
        n: int | str = "all"
    elif config.n_facts is None and config.protocol.paper_size:
        n = "paper"
    else:
        n = config.n_facts or DEFAULT_N_FACTS
    parts = (
        [config.kind]
        + (
            [facts_file_tag(config.facts_path)]
            if config.kind == "custom" and config.facts_path
            else []
        )
        + ([tag] if (tag := config.protocol.dataset_tag) else [])
        + ([config.shuffle] if config.shuffle != SHUFFLES[0] else [])
        + [config.direction]
        + (["split"] if config.split else [])
        + [f"n{n}", f"seed{config.seed}"]
    )
    return "-".join(parts)


__all__ = [
    "CORPUS_FILE",
    "GENERATOR_VERSION",
    "DatasetConfig",
    "build_dataset",
    "check_dataset_folder",
    "default_dataset_name",
    "generate_dataset",
    "generator_version",
    "load_dataset_corpus",
    "load_facts",
    "load_manifest",
    "load_train_records",
    "render_test_prompts",
    "render_training",
    "renderings_per_fact",
    "validate_config",
    "verify_dataset",
]
