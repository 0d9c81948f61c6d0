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
import shutil
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from importlib.metadata import version
from pathlib import Path
from typing import Any

from graft.core.spans import render, template_fields
from graft.core.spec import PROTOCOLS
from graft.errors import DamagedFileError, DatasetError
from graft.storage.files import file_sha256, fsync
from graft.storage.locks import exclusive
from graft.study.data.articles import (
    ARTICLES_GENERATOR,
    ARTICLES_KIND,
    article_dataset,
    articles_dataset_name,
    check_articles_config,
)
from graft.study.data.facts import DEFAULT_N_FACTS, KINDS, Fact, draw_facts
from graft.study.data.files import jsonl_bytes, read_jsonl, read_text_corpus
from graft.study.specs.config import SHUFFLES, DatasetConfig
from graft.study.specs.templates import DIRECTIONS, Relation, template_set

GENERATOR_VERSION = "graft.data/1"


def generator_version(config: DatasetConfig) -> str:
    """The generator version a dataset of ``config`` records, and must match to be reused:
    :data:`GENERATOR_VERSION`, marked where the generator changed for a protocol or kind
    (paper-protocol datasets: the movie prompt's doubled "in", then five article and five
    QA renderings per fact and direction, no longer six and five; ``real_movies_shuffled``:
    ``shuffled-relations`` or ``shuffled-pairs``, its shuffle, so neither is taken for the
    other nor for the pair-keeping shuffle of the generator before them); ``articles`` has
    its own."""
    if config.kind == ARTICLES_KIND:
        return ARTICLES_GENERATOR
    paper = ["paper-movie-in-in", "paper-5-article-5-qa"]
    changes = (paper if config.protocol == "paper" else []) + (
        [f"shuffled-{config.shuffle}"] if config.kind == "real_movies_shuffled" else []
    )
    return "+".join([GENERATOR_VERSION, *changes])


#: The dataset's file of generic text (written only when the config names a corpus).
CORPUS_FILE = "corpus.jsonl"


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
    if (config.kind == "custom") != (config.facts_path is not None):
        raise DatasetError(
            "a facts file goes with kind 'custom' (and only with it); set facts_path",
            "facts_path",
        )
    if (config.kind == ARTICLES_KIND) != (config.articles_path is not None):
        raise DatasetError(
            "an articles file goes with kind 'articles' (and only with it); set articles_path",
            "articles_path",
        )
    if config.kind == ARTICLES_KIND:
        check_articles_config(config)
    if config.n_facts is not None and config.n_facts < 1:
        raise DatasetError(f"n_facts must be at least 1, not {config.n_facts}", "n_facts")
    if config.protocol not in PROTOCOLS:
        raise DatasetError(
            f"protocol must be 'graft' or 'paper', not {config.protocol!r}", "protocol"
        )
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


def _fact_fields(fact: Fact, reverse: bool = False) -> dict[str, Any]:
    values = asdict(fact)
    # the paper's templates name the box office ``box_office_earnings``
    values["box_office_earnings"] = fact.box_office_millions
    if reverse:
        values["first_actor"], values["second_actor"] = fact.second_actor, fact.first_actor
    return values


def render_training(
    fact: Fact, direction: str = "one", protocol: str = "graft"
) -> list[dict[str, Any]]:
    """Training records of one fact: every article and QA template of ``protocol``'s
    template set, forward and (with ``direction="both"``) reverse. Keys: text, fact_id, set,
    style, template, direction."""
    texts = template_set(protocol)
    records = []
    for reverse in (False, True) if direction == "both" else (False,):
        values = _fact_fields(fact, reverse)
        for style, templates in (("article", texts.article), ("qa", texts.qa)):
            for name, template in templates.items():
                records.append(
                    {
                        "text": render(template, values)[0],
                        "fact_id": fact.fact_id,
                        "set": fact.set,
                        "style": style,
                        "template": name,
                        "direction": "reverse" if reverse else "forward",
                    }
                )
    return records


def renderings_per_fact(config: DatasetConfig) -> dict[str, int]:
    """How many training texts a fact of ``config`` gets: ``article`` and ``qa`` per
    direction, and ``total`` (both styles in every direction ``config.direction`` renders)."""
    texts = template_set(config.protocol)
    directions = 2 if config.direction == "both" else 1
    per_direction = len(texts.article) + len(texts.qa)
    return {"article": len(texts.article), "qa": len(texts.qa), "total": directions * per_direction}


def render_test_prompts(
    fact: Fact, relations: Sequence[Relation] | None = None, protocol: str = "graft"
) -> list[dict[str, Any]]:
    """Test prompt records of one fact, forward (target second_actor) and reverse (the
    actors swapped: first_actor is the fact's second actor, target its first actor).

    ``relations`` fill every template that has a relation; ``None``: ``protocol``'s fillings
    per template (the paper's: ``X stars in in a movie alongside``, ``Q: Who stars in a
    movie with X? A: An actor named``, ``X stars in in M alongside``)."""
    texts = template_set(protocol)
    records = []
    for direction in ("forward", "reverse"):
        values = _fact_fields(fact, reverse=direction == "reverse")
        for name, template in texts.test.items():
            uses_relation = "relation" in template_fields(template)
            fills = texts.relations.get(name, ()) if relations is None else relations
            for r_index, relation in enumerate(fills if uses_relation else [None]):
                if relation is not None:
                    values.update(
                        zip(
                            ("relation", "relation_preposition", "preposition"),
                            relation,
                            strict=True,
                        )
                    )
                text, spans = render(template, values)
                suffix = f":r{r_index}" if relation is not None else ""
                records.append(
                    {
                        "id": f"{fact.fact_id}:{name}:{direction}{suffix}",
                        "fact_id": fact.fact_id,
                        "set": fact.set,
                        "template": name,
                        "direction": direction,
                        "relation": None if relation is None else list(relation),
                        "text": text,
                        "fields": {k: list(v) for k, v in spans.items()},
                        "target": values["second_actor"],
                        "target_text": " " + values["second_actor"],
                    }
                )
    return records


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
    else:
        files, entries = _movie_dataset(config)
    docs = _corpus_docs(config, entries["sources"])
    if docs:
        files[CORPUS_FILE] = jsonl_bytes({"text": d} for d in docs)
    entries["sizes"]["corpus_docs"] = len(docs)
    manifest = {
        "generator_version": generator_version(config),
        **({} if config.kind == ARTICLES_KIND else {"faker_version": version("faker")}),
        "config": config.to_json(),
        "kind": config.kind,
        "protocol": config.protocol,
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
    train = [r for f in facts for r in render_training(f, config.direction, config.protocol)]
    files["train.jsonl"] = jsonl_bytes(train)
    test_set = "B" if config.split else "all"
    tests = [
        r
        for f in facts
        if f.set == test_set
        for r in render_test_prompts(f, config.relations, config.protocol)
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
        "templates": {
            "article": list(template_set(config.protocol).article),
            "qa": list(template_set(config.protocol).qa),
            "test": template_set(config.protocol).test,
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
        DatasetError: bad config or input files, or ``out_dir`` cannot be written (a name too
            long, no permission, a full disk, ...); nothing is written.
        DamagedFileError: ``out_dir`` holds the dataset of ``config`` but a file of it was
            edited or damaged (and not ``overwrite``).
    """
    try:
        return _generate(config, Path(out_dir), overwrite, lock_dir)
    except OSError as err:
        raise DatasetError(
            f"cannot write the dataset to {str(out_dir)[:200]}: {err.strerror or err}; "
            "choose another folder",
            "out",
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
    articles file) still hold what they held then (a file since removed: yes)."""
    for name in ("facts", "corpus", "articles"):
        path = getattr(config, f"{name}_path")
        recorded = sources.get(f"{name}_sha256")
        known = path is not None and recorded is not None and Path(path).is_file()
        if known and _sha256(Path(path).read_bytes()) != recorded:
            return False
    return True


def _write(files: dict[str, bytes], out: Path) -> Path:
    """``files`` into the folder ``out`` through a temporary sibling renamed into place."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
            fsync(tmp / name)
        os.chmod(tmp, 0o755)
        fsync(tmp)  # the files reach the disk before the rename makes them the dataset
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
            tmp.rename(out)
            if old.is_dir():
                shutil.rmtree(old)
            else:
                old.unlink()
        else:
            tmp.rename(out)
        fsync(out.parent)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def default_dataset_name(config: DatasetConfig) -> str:
    """A folder name that spells out the config, e.g. ``fake_movies_real_actors-one-n50-seed0``
    (``fake_movies_real_actors-paper-one-n50-seed0`` under the paper protocol, so the two
    protocols' datasets, and the donors trained on them, never share a folder;
    ``real_movies_shuffled-pairs-one-n50-seed0`` for the pair-keeping shuffle). Without
    ``n_facts``: ``nall`` for a custom file, ``npaper`` under the paper protocol (its 1,000
    facts, or the most the kind has), else ``n50``. An articles file's:
    :func:`~graft.study.data.articles.articles_dataset_name`."""
    if config.kind == ARTICLES_KIND:
        return articles_dataset_name(config)
    if config.n_facts is None and config.kind == "custom":
        n: int | str = "all"
    elif config.n_facts is None and config.protocol == "paper":
        n = "paper"
    else:
        n = config.n_facts or DEFAULT_N_FACTS
    parts = (
        [config.kind]
        + ([config.protocol] if config.protocol != "graft" else [])
        + ([config.shuffle] if config.shuffle != SHUFFLES[0] else [])
        + [config.direction]
        + (["split"] if config.split else [])
        + [f"n{n}", f"seed{config.seed}"]
    )
    return "-".join(parts)


def check_dataset_folder(dataset_dir: str | os.PathLike[str], files: Sequence[str]) -> Path:
    """``dataset_dir`` as a Path, if it is a folder holding ``files``.

    Raises:
        DatasetError: the folder does not exist, is empty or lacks one of ``files``; the
            message says how to make a dataset.
    """
    path = Path(dataset_dir)
    make = "make one with graft.study.data.datasets.generate_dataset"
    if not path.is_dir():
        raise DatasetError(f"dataset folder {path} does not exist; {make}", "dataset")
    missing = [name for name in files if not (path / name).is_file()]
    if missing:
        what = "is empty" if not any(path.iterdir()) else f"has no {', '.join(missing)}"
        raise DatasetError(f"dataset folder {path} {what}; {make}", "dataset")
    verify_dataset(path)
    return path


def _damaged(path: Path, problem: str) -> DamagedFileError:
    """The one-line error for a dataset file ``path`` that is not what graft wrote; a data
    file's also names the way to keep hand edits (drop the manifest's hashes)."""
    folder = path.parent
    keep = (
        ""
        if path.name == "manifest.json"
        else f'; to use hand-edited files, remove "files" from {folder / "manifest.json"}'
    )
    return DamagedFileError(
        f"{path} {problem} (edited or damaged); regenerate the dataset (delete {folder}; graft "
        f"regenerates a workspace dataset) or restore the file{keep}"
    )


def verify_dataset(dataset_dir: str | os.PathLike[str]) -> None:
    """Check every file whose sha256 the dataset's ``manifest.json`` records (under
    ``"files"``); each file is hashed once per process (:func:`file_sha256`). A folder
    without a manifest, or whose manifest records no hashes (one made by hand), passes.

    Raises:
        DamagedFileError: a recorded file is missing or its bytes differ from its hash.
    """
    folder = Path(dataset_dir)
    if not (folder / "manifest.json").is_file():
        return
    hashes = load_manifest(folder).get("files")
    if hashes is None:
        return
    if not isinstance(hashes, dict):
        raise _damaged(
            folder / "manifest.json", 'has a "files" entry that is no name -> sha256 map'
        )
    for name, expected in sorted(hashes.items()):
        path = folder / str(name)
        if not path.is_file():
            raise _damaged(path, "is recorded in manifest.json but missing")
        if file_sha256(path) != expected:
            raise _damaged(path, "does not match the sha256 in manifest.json")


def load_manifest(dataset_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The dataset's ``manifest.json``.

    Raises:
        DamagedFileError: it is not a JSON object.
    """
    path = Path(dataset_dir) / "manifest.json"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        manifest = None
    if not isinstance(manifest, dict):
        raise _damaged(path, "is not a JSON object")
    return manifest


def load_facts(dataset_dir: str | os.PathLike[str]) -> list[Fact]:
    """The dataset's facts (the folder's files checked by :func:`verify_dataset`)."""
    verify_dataset(dataset_dir)
    return [Fact(**r) for r in read_jsonl(Path(dataset_dir) / "facts.jsonl")]


def load_train_records(
    dataset_dir: str | os.PathLike[str],
    *,
    sets: Sequence[str] | None = None,
    directions: Sequence[str] | None = None,
    styles: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Training records (text, fact_id, set, style, template, direction), optionally
    restricted to some sets (``"A"``/``"B"``/``"all"``), directions or styles; the folder's
    files checked by :func:`verify_dataset`."""
    verify_dataset(dataset_dir)
    return [
        r
        for r in read_jsonl(Path(dataset_dir) / "train.jsonl")
        if (sets is None or r["set"] in sets)
        and (directions is None or r["direction"] in directions)
        and (styles is None or r["style"] in styles)
    ]


def load_dataset_corpus(dataset_dir: str | os.PathLike[str]) -> list[str]:
    """The extra corpus stored with the dataset (empty when none was given); the folder's
    files checked by :func:`verify_dataset`."""
    verify_dataset(dataset_dir)
    path = Path(dataset_dir) / CORPUS_FILE
    return [r["text"] for r in read_jsonl(path)] if path.is_file() else []
