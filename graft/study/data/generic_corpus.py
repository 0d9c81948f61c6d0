"""The generic text a gentle finetune mixes in: which corpus it is, and its passages.

The paper's less aggressive finetuning (A.3.3, C.4) supplemented the fact texts with 10,000
examples from openwebtext and IMDB reviews. :attr:`FinetuneConfig.generic_corpus
<graft.study.specs.presets.FinetuneConfig.generic_corpus>` chooses the corpus:

- ``None``: the dataset's own ``corpus.jsonl`` when it has one, else the paper's corpus
  (:data:`PAPER_SOURCES`, :data:`PAPER_SIZE` passages sampled with :data:`SAMPLE_SEED`)
  from the Hugging Face hub through the optional ``datasets`` library, kept in the
  workspace (``<workspace>/corpora``) after the first download; when the library or the hub
  is unavailable, the shipped passages (:data:`~graft.study.data.files.GENERIC_TEXT`), a
  labelled stand-in, with a warning;
- a file: its passages (one per line, or JSONL with ``text``);
- :data:`STAND_IN`: the shipped passages, asked for.

:func:`settle` fixes that choice into ``generic_corpus_id`` (hub ids and sample seed, the
file's sha256, or the stand-in's), which is part of the donor's folder name and its
``finetune_config.json``: donors trained with different corpora are different donors.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

from graft.errors import DatasetError, FinetuneError, HubUnavailable, first_line
from graft.models.hub import HUB_PROBE_SECONDS, hub_endpoint, hub_reachable, offline_requested
from graft.storage.files import atomic_path, file_sha256
from graft.study.data.datasets import CORPUS_FILE, load_dataset_corpus
from graft.study.data.files import GENERIC_TEXT, jsonl_bytes, load_generic_texts
from graft.study.specs.presets import FinetuneConfig

logger = logging.getLogger(__name__)

#: The paper's generic corpus: (hub dataset id, text column), half the sample from each.
PAPER_SOURCES: tuple[tuple[str, str], ...] = (
    ("Skylion007/openwebtext", "text"),
    ("stanfordnlp/imdb", "text"),
)
#: Passages of the paper's generic corpus (A.3.3: "10,000 examples").
PAPER_SIZE = 10_000
#: Seed of the hub sample (a streaming shuffle with :data:`SHUFFLE_BUFFER`): fixed, so every
#: finetune seed draws its passages from the same corpus.
SAMPLE_SEED = 0
SHUFFLE_BUFFER = 10_000
#: Passages are kept cut to this many characters (a finetune reads at most ``max_length``
#: tokens of each, 128 by default).
KEEP_CHARS = 4_000
#: ``generic_corpus`` value that asks for the shipped stand-in passages.
STAND_IN = "stand-in"
#: ``generic_corpus_id`` of the paper's corpus.
HUB_ID = (
    "hub:" + "+".join(repo for repo, _ in PAPER_SOURCES) + f";n={PAPER_SIZE};seed={SAMPLE_SEED}"
)
#: The cache file of the paper's corpus in a workspace's ``corpora`` folder.
HUB_FILE = f"openwebtext-imdb-n{PAPER_SIZE}-seed{SAMPLE_SEED}.jsonl"


@dataclass(frozen=True)
class GenericCorpus:
    """The generic passages of a finetune and what they are.

    Args:
        texts: the passages.
        identity: what the corpus is, recorded as ``generic_corpus_id``: ``hub:<ids>;n=;seed=``,
            ``file:<name>;sha256=<16 hex>``, ``dataset:sha256=...`` or ``stand-in:sha256=...``.
        source: where the passages were read from (a file, or the hub).
        stand_in: the shipped stand-in passages, not a real generic corpus.
    """

    texts: list[str]
    identity: str
    source: str
    stand_in: bool = False

    def record(self) -> dict[str, object]:
        """What a donor's ``finetune_config.json`` records of it."""
        record: dict[str, object] = {
            "identity": self.identity,
            "source": self.source,
            "passages": len(self.texts),
            "texts_sha256": corpus_hash(self.texts),
            "stand_in": self.stand_in,
        }
        if self.stand_in:
            record["note"] = STAND_IN_NOTE
        return record


#: What a donor trained with the stand-in records about it.
STAND_IN_NOTE = (
    "graft's 61 shipped passages stand in for the paper's generic corpus (10,000 passages of "
    "openwebtext and IMDB): not the paper's gentle finetuning"
)


def _short_sha(path: Path) -> str:
    return file_sha256(path)[:16]


def _stand_in() -> GenericCorpus:
    return GenericCorpus(
        load_generic_texts(),
        f"{STAND_IN}:sha256={_short_sha(GENERIC_TEXT)}",
        "graft/resources/generic_text.txt",
        stand_in=True,
    )


def _file(path: Path) -> GenericCorpus:
    texts = load_generic_texts(path)
    return GenericCorpus(texts, f"file:{path.name};sha256={_short_sha(path)}", str(path))


#: The branch where the hub keeps its Parquet copy of a dataset (datasets 4 runs no loading
#: scripts, which openwebtext's main branch has had).
PARQUET_REVISION = "refs/convert/parquet"


def _stream(datasets: object, repo: str) -> object:
    """``repo``'s train split as a stream: its main branch, else its Parquet copy."""
    load = datasets.load_dataset  # type: ignore[attr-defined]
    try:
        return load(repo, split="train", streaming=True)
    except Exception as first:  # the hub client raises many kinds: offline, HTTP, format
        try:
            return load(repo, split="train", streaming=True, revision=PARQUET_REVISION)
        except Exception:
            raise first from None


class PaperCorpusHub:
    """The paper's corpus on the hub, asked at most once by this object: after a failure it
    raises the same :class:`~graft.errors.HubUnavailable` again without asking (the download
    library retries for a while before it fails). Whoever locates several donors keeps one
    (a :class:`~graft.study.training.workspace.Workspace` does); two objects share nothing.

    Attributes:
        failure: why the hub could not be read, once it could not be.
    """

    def __init__(self) -> None:
        self.failure: str | None = None

    def fetch(self, n: int = PAPER_SIZE, seed: int = SAMPLE_SEED) -> list[str]:
        """``n`` passages of the paper's corpus, half from each of :data:`PAPER_SOURCES`,
        read from the hub by streaming (nothing else is downloaded) with a seeded shuffle.

        Raises:
            HubUnavailable: ``datasets`` is not installed, or the hub could not be read (now
                or at an earlier ask of this object).
        """
        try:
            import datasets  # the optional extra graft-interp[corpus]
        except ImportError:
            raise HubUnavailable(
                "the optional datasets library is not installed (pip install 'graft-interp[corpus]')"
            ) from None
        if self.failure is None and not hub_reachable():  # not minutes of retries
            self.failure = (
                f"the hub ({hub_endpoint()}) did not answer within {HUB_PROBE_SECONDS:g} s"
                if not offline_requested()
                else "offline mode is on (HF_HUB_OFFLINE)"
            )
        if self.failure is not None:
            raise HubUnavailable(self.failure)
        texts: list[str] = []
        for (repo, column), k in zip(PAPER_SOURCES, (n - n // 2, n // 2), strict=True):
            try:
                stream = _stream(datasets, repo)
                rows = stream.shuffle(seed=seed, buffer_size=SHUFFLE_BUFFER).take(k)  # type: ignore[attr-defined]
                texts += [t[:KEEP_CHARS] for t in (str(r[column]).strip() for r in rows) if t]
            except Exception as err:  # the hub client raises many kinds: offline, HTTP, format
                self.failure = (
                    f"{repo} could not be read from the hub "
                    f"({type(err).__name__}: {first_line(err)})"
                )
                raise HubUnavailable(self.failure) from err
        return texts


def fetch_paper_corpus(
    n: int = PAPER_SIZE, seed: int = SAMPLE_SEED, *, hub: PaperCorpusHub | None = None
) -> list[str]:
    """:meth:`PaperCorpusHub.fetch` of ``hub`` (``None``: a new one, which asks the hub).

    Raises:
        HubUnavailable: ``datasets`` is not installed, or the hub could not be read (now or
            at an earlier ask of ``hub``).
    """
    return (PaperCorpusHub() if hub is None else hub).fetch(n, seed)


def _paper(
    corpus_dir: Path | None, *, fetch: bool, hub: PaperCorpusHub | None
) -> GenericCorpus | str:
    """The paper's corpus (from ``corpus_dir``'s cache, else the hub, asked through ``hub``,
    cached there), or why it is unavailable. Without ``fetch`` nothing is downloaded: a corpus
    not cached yet is returned with no texts when ``datasets`` is installed (a plan's guess)."""
    cached = corpus_dir / HUB_FILE if corpus_dir is not None else None
    if cached is not None and cached.is_file():
        return GenericCorpus(load_generic_texts(cached), HUB_ID, str(cached))
    if not fetch:
        try:
            import datasets  # noqa: F401
        except ImportError:
            return "the optional datasets library is not installed"
        return GenericCorpus([], HUB_ID, "the hub (downloaded when the finetune starts)")
    try:
        texts = fetch_paper_corpus(hub=hub)
    except HubUnavailable as err:
        return str(err)
    if cached is None:
        return GenericCorpus(texts, HUB_ID, "the hub")
    with atomic_path(cached) as tmp:
        tmp.write_bytes(jsonl_bytes({"text": t} for t in texts))
    logger.info("the paper's generic corpus (%d passages) is kept in %s", len(texts), cached)
    return GenericCorpus(texts, HUB_ID, str(cached))


def choose(
    cfg: FinetuneConfig,
    dataset_dir: str | Path,
    corpus_dir: Path | None = None,
    *,
    fetch: bool = True,
    hub: PaperCorpusHub | None = None,
) -> GenericCorpus:
    """The corpus ``cfg`` asks for (see the module docstring); with ``cfg.generic_corpus_id``
    set, exactly that one. A fallback to the stand-in is said in a warning. ``hub`` asks the
    hub for the paper's corpus (``None``: a new :class:`PaperCorpusHub`).

    Raises:
        FinetuneError: a corpus file is missing, unreadable, empty or changed since the id
            was fixed, or the hub corpus of a fixed id cannot be had.
    """
    try:
        corpus = _choose(cfg, Path(dataset_dir), corpus_dir, fetch, hub)
    except DatasetError as err:
        raise FinetuneError(str(err), param="generic_corpus") from None
    fixed = cfg.generic_corpus_id
    if fixed is not None and corpus.identity != fixed:
        raise FinetuneError(
            f"the generic corpus is now {corpus.identity}, but this finetune was set up with "
            f"{fixed}; restore the corpus or give the one you mean",
            param="generic_corpus",
        )
    return corpus


def _choose(
    cfg: FinetuneConfig,
    dataset_dir: Path,
    corpus_dir: Path | None,
    fetch: bool,
    hub: PaperCorpusHub | None,
) -> GenericCorpus:
    given, fixed = cfg.generic_corpus, cfg.generic_corpus_id or ""
    if given == STAND_IN or fixed.startswith(STAND_IN):
        return _stand_in()
    if given is not None:
        return _file(Path(given).expanduser().resolve())
    own = load_dataset_corpus(dataset_dir)
    if own:
        path = dataset_dir / CORPUS_FILE
        return GenericCorpus(own, f"dataset:sha256={_short_sha(path)}", str(path))
    paper = _paper(corpus_dir, fetch=fetch, hub=hub)
    if isinstance(paper, GenericCorpus):
        return paper
    if fixed == HUB_ID:
        raise FinetuneError(
            f"this finetune was set up with the paper's generic corpus, which is unavailable "
            f"now: {paper}",
            param="generic_corpus",
        )
    logger.warning(
        "the paper's generic corpus (openwebtext + IMDB, %s passages) is unavailable: %s; "
        "mixing in graft's %d shipped stand-in passages instead (a different donor; give a "
        "generic corpus file, generic_corpus, for your own)",
        f"{PAPER_SIZE:,}",
        paper,
        len(load_generic_texts()),
    )
    return _stand_in()


def settle(
    cfg: FinetuneConfig,
    dataset_dir: str | Path,
    corpus_dir: Path | None = None,
    *,
    fetch: bool = True,
    hub: PaperCorpusHub | None = None,
) -> FinetuneConfig:
    """``cfg`` with its generic corpus fixed: ``generic_corpus_id`` set (and a file's path
    made absolute), so the donor's folder and record name the corpus. A corpus given to a
    config that mixes in no generic text is dropped (with a warning: it would change
    nothing but the folder); a settled config is returned as it is. ``hub``: as for
    :func:`choose`."""
    if cfg.generic_ratio <= 0:
        if cfg.generic_corpus is None:
            return cfg
        logger.warning(
            "generic_corpus %s is ignored: the %s preset mixes in no generic text (gentle does)",
            cfg.generic_corpus,
            cfg.name,
        )
        return dataclasses.replace(cfg, generic_corpus=None, generic_corpus_id=None)
    if cfg.generic_corpus_id is not None:
        return cfg
    corpus = choose(cfg, dataset_dir, corpus_dir, fetch=fetch, hub=hub)
    given = cfg.generic_corpus
    if corpus.stand_in:  # asked for or fallen back to: one donor either way
        given = STAND_IN
    elif given is not None:
        given = str(Path(given).expanduser().resolve())
    return dataclasses.replace(cfg, generic_corpus=given, generic_corpus_id=corpus.identity)


def corpus_hash(texts: list[str]) -> str:
    """A short hash of passages (for the record of a corpus read from the hub)."""
    return hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]
