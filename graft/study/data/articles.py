"""A dataset from the user's own articles: the study's real-text variant.

The donor is finetuned on free text (articles about entities, and rephrases of them) instead
of templated facts, and tested on the user's question prompts. The input is a JSONL file,
one article per line::

    {"id": "zellwood",                      # optional; default a1, a2, ... (unique)
     "source": "https://en.wikipedia.org/...",  # optional, recorded as given
     "article": "Marla Zellwood is ...",    # the text the donor is finetuned on
     "rephrases": ["...", "..."],           # optional: more texts with the same facts
     "questions": [                         # optional per article; some article needs one
        {"prompt": "Marla Zellwood founded the studio with",
         "answer": "Tobin Farrow",          # the target: " " + answer follows the prompt
         "first_entity": "Marla Zellwood",  # FE: its first whole-word occurrence in prompt
         "template": "cloze"}]}             # optional group name; default "question"

Every blank-line-separated paragraph of an article or a rephrase is one training text (a
finetune reads the first ``max_length`` tokens of each text, 128 in the presets). Prompts
and answers are stripped of surrounding whitespace; the target is the first token of
``" " + answer`` after the prompt, and whole-name scoring scores every token of it. The FE
span is the first occurrence of ``first_entity`` in the prompt that is not part of a
longer word; LT is the prompt's last token.

:func:`article_dataset` turns the file into the files of a dataset folder (written by
:func:`graft.study.data.datasets.generate_dataset`, kind ``articles``), which every experiment
reads like a generated one.
"""

from __future__ import annotations

import logging
import re
from dataclasses import asdict, dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any

from graft.errors import DatasetError
from graft.naming import slug
from graft.study.data.files import RESOURCES, jsonl_bytes, read_jsonl
from graft.study.specs.config import DatasetConfig
from graft.study.specs.protocol import GRAFT
from graft.study.specs.template_file import TEMPLATE_NAME

logger = logging.getLogger(__name__)

#: The dataset kind of an articles file (:class:`DatasetConfig` ``kind``).
ARTICLES_KIND = "articles"
#: The template name of a question that gives none.
DEFAULT_TEMPLATE = "question"
#: The shipped example: invented articles about invented people and things (synthetic).
EXAMPLE_ARTICLES = RESOURCES / "synthetic_articles.jsonl"
#: The generator version of an articles dataset (recorded in its manifest).
ARTICLES_GENERATOR = "graft.articles/1"

_ITEM_KEYS = ("id", "source", "article", "rephrases", "questions")
_QUESTION_KEYS = ("prompt", "answer", "first_entity", "template")
_PARAM = "articles_path"


@dataclass
class Question:
    """One test question of an article.

    Args:
        prompt: the prompt text (stripped), which the answer follows after a space.
        answer: the answer (stripped): the target text is ``" " + answer``.
        first_entity: the first entity's text, as written in the prompt.
        template: the group the question is summarised in.
        fe_span: character span ``[start, end)`` of ``first_entity`` in ``prompt``.
    """

    prompt: str
    answer: str
    first_entity: str
    template: str
    fe_span: tuple[int, int]


@dataclass
class Article:
    """One article of an articles file.

    Args:
        article_id: its id (given, or ``a<n>`` for the n-th article).
        article: the article text.
        rephrases: more texts stating the same facts.
        questions: its test questions.
        source: where the text comes from (free text, e.g. a URL), as given.
    """

    article_id: str
    article: str
    rephrases: list[str] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)
    source: str = ""


def entity_span(prompt: str, entity: str) -> tuple[int, int] | None:
    """The character span of the first occurrence of ``entity`` in ``prompt`` that is not
    part of a longer word (``"Ann"`` is not found in ``"Anna"``), or None."""
    found = re.search(rf"(?<!\w){re.escape(entity)}(?!\w)", prompt)
    return None if found is None else found.span()


def paragraphs(text: str) -> list[str]:
    """The blank-line-separated paragraphs of ``text``, stripped, empty ones left out."""
    return [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]


def _text(where: str, value: Any, what: str, fix: str) -> str:
    """``value`` stripped, if it is a non-empty string; else a one-line error."""
    if isinstance(value, str) and value.strip():
        return value.strip()
    if value is None:
        problem = "is missing"
    elif isinstance(value, str):
        problem = "is empty"
    else:
        problem = f"must be a string, not {type(value).__name__}"
    raise DatasetError(f"{where}: {what} {problem}; {fix}", _PARAM)


def _unknown_keys(where: str, row: dict[str, Any], known: tuple[str, ...]) -> None:
    unknown = sorted(set(row) - set(known))
    if unknown:
        raise DatasetError(
            f"{where}: unknown key {unknown[0]!r}; the keys are {', '.join(known)}", _PARAM
        )


def _question(where: str, row: Any) -> Question:
    """One question object, checked."""
    if not isinstance(row, dict):
        raise DatasetError(
            f"{where} must be an object with prompt, answer and first_entity, not "
            f"{type(row).__name__}",
            _PARAM,
        )
    _unknown_keys(where, row, _QUESTION_KEYS)
    prompt = _text(where, row.get("prompt"), "'prompt'", "give the text the answer follows")
    answer = _text(where, row.get("answer"), "'answer'", "give the name the prompt asks for")
    entity = _text(
        where, row.get("first_entity"), "'first_entity'", "give the prompt's first entity"
    )
    template = row.get("template", DEFAULT_TEMPLATE)
    if not isinstance(template, str) or not TEMPLATE_NAME.fullmatch(template):
        raise DatasetError(
            f"{where}: template {template!r} is no name; use letters, digits, '_' and '-'",
            _PARAM,
        )
    span = entity_span(prompt, entity)
    if span is None:
        raise DatasetError(
            f"{where}: first_entity {entity!r} is not in its prompt {prompt!r} as a whole "
            "word; write it exactly as the prompt does",
            _PARAM,
        )
    return Question(prompt, answer, entity, template, span)


def _article(where: str, row: dict[str, Any], default_id: str) -> Article:
    """One article object, checked."""
    _unknown_keys(where, row, _ITEM_KEYS)
    raw_id = row.get("id", default_id)
    if isinstance(raw_id, bool) or not isinstance(raw_id, str | int) or not str(raw_id).strip():
        raise DatasetError(f"{where}: 'id' must be a non-empty string or number", _PARAM)
    article = _text(where, row.get("article"), "'article'", "give the text to finetune on")
    rephrases = row.get("rephrases", [])
    if not isinstance(rephrases, list):
        raise DatasetError(
            f"{where}: 'rephrases' must be a list of texts, not {type(rephrases).__name__}",
            _PARAM,
        )
    texts = [
        _text(where, r, f"rephrase {i}", "give a text or drop it from the list")
        for i, r in enumerate(rephrases, 1)
    ]
    questions = row.get("questions", [])
    if not isinstance(questions, list):
        raise DatasetError(
            f"{where}: 'questions' must be a list of objects, not {type(questions).__name__}",
            _PARAM,
        )
    checked = [_question(f"{where}, question {i}", q) for i, q in enumerate(questions, 1)]
    source = row.get("source", "")
    if not isinstance(source, str):
        raise DatasetError(f"{where}: 'source' must be a string (e.g. a URL)", _PARAM)
    return Article(str(raw_id).strip(), article, texts, checked, source.strip())


def read_articles(path: str | Path) -> list[Article]:
    """The articles of a JSONL articles file (format: the module docstring), checked.

    Raises:
        DatasetError: the file is missing, unreadable or not JSONL; an article lacks its
            text or has an unknown key; a question lacks its prompt, answer or first
            entity, or its first entity is not in its prompt; two articles share an id; no
            article has a question. The message names the line and the fix.
    """
    path = Path(path)
    rows = read_jsonl(path, _PARAM)
    lines = path.read_text(encoding="utf-8").splitlines()
    numbers = [n for n, line in enumerate(lines, 1) if line.strip()]
    articles = [
        _article(f"{path}, line {number}", row, f"a{i}")
        for i, (number, row) in enumerate(zip(numbers, rows, strict=True), 1)
    ]
    if not articles:
        raise DatasetError(
            f"{path} holds no articles; write one JSON object per line with 'article' and "
            "'questions'",
            _PARAM,
        )
    seen: dict[str, int] = {}
    for number, a in zip(numbers, articles, strict=True):
        if a.article_id in seen:
            raise DatasetError(
                f"{path}, line {number}: id {a.article_id!r} is also the id of line "
                f"{seen[a.article_id]}; give every article its own id",
                _PARAM,
            )
        seen[a.article_id] = number
    if not any(a.questions for a in articles):
        raise DatasetError(
            f"{path}: no article has questions; give at least one article 'questions' to test on",
            _PARAM,
        )
    return articles


def _train_records(index: int, a: Article) -> list[dict[str, Any]]:
    """Training records of one article: each paragraph of the article and its rephrases."""
    records = []
    for style, n, text in [("article", 0, a.article)] + [
        ("rephrase", i, t) for i, t in enumerate(a.rephrases, 1)
    ]:
        for p, part in enumerate(paragraphs(text), 1):
            records.append(
                {
                    "text": part,
                    "fact_id": index,
                    "set": "all",
                    "style": style,
                    "template": f"{style}{n or ''}:p{p}",
                    "direction": "forward",
                    "article_id": a.article_id,
                }
            )
    return records


def _test_records(index: int, a: Article) -> list[dict[str, Any]]:
    """Test prompt records of one article's questions (one direction: forward)."""
    return [
        {
            "id": f"{a.article_id}:q{j}",
            "fact_id": index,
            "set": "all",
            "template": q.template,
            "direction": "forward",
            "relation": None,
            "text": q.prompt,
            "fields": {"FE": list(q.fe_span)},
            "target": q.answer,
            "target_text": " " + q.answer,
            "article_id": a.article_id,
        }
        for j, q in enumerate(a.questions, 1)
    ]


def _unlearnable(a: Article) -> list[str]:
    """Ids of ``a``'s questions whose answer none of its texts contains."""
    texts = [a.article, *a.rephrases]
    return [
        f"{a.article_id}:q{j}"
        for j, q in enumerate(a.questions, 1)
        if not any(q.answer in t for t in texts)
    ]


def check_articles_config(config: DatasetConfig, source: str = _PARAM) -> None:
    """Refuse the options a dataset of the user's own texts has no use for (kind
    ``articles``, or ``relation`` with ``source="relation_path"``)."""
    unused = {
        "direction": config.direction != "one",
        "split": config.split,
        "relations": config.relations is not None,
        "protocol": config.protocol != GRAFT,
        "facts_path": config.facts_path is not None,
    }
    wrong = [name for name, set_ in unused.items() if set_]
    if wrong:
        raise DatasetError(
            f"a dataset of kind {config.kind!r} takes its texts and questions from {source}; "
            f"drop {wrong[0]} (it applies to the templated movie datasets only)",
            wrong[0],
        )


def articles_dataset_name(config: DatasetConfig) -> str:
    """``articles-<file name>-<its sha256, 8 digits>-n<N or all>``: the workspace folder of
    an articles dataset; an edited file makes a new dataset (and new donors), never a stale
    one."""
    assert config.articles_path is not None
    path = Path(config.articles_path)
    try:
        digest = sha256(path.read_bytes()).hexdigest()[:8]
    except OSError:
        read_articles(path)  # the one-line error of a missing or unreadable file
        raise
    n = "all" if config.n_facts is None else config.n_facts
    return f"articles-{slug(path.stem)}-{digest}-n{n}"


def article_dataset(config: DatasetConfig) -> tuple[dict[str, bytes], dict[str, Any]]:
    """The data files of an articles dataset (``articles.jsonl``, ``train.jsonl``,
    ``test_prompts.jsonl``) and its manifest's entries; the caller adds the corpus, the
    files' hashes and the common entries (:func:`graft.study.data.datasets.build_dataset`).
    ``config.n_facts`` keeps the first that many articles (None: all)."""
    assert config.articles_path is not None  # validate_config checked it
    path = Path(config.articles_path)
    files, manifest = articles_files(read_articles(path), config.n_facts, str(path))
    manifest["sources"] = {
        "articles_path": str(path),
        "articles_sha256": sha256(path.read_bytes()).hexdigest(),
    }
    return files, manifest


def articles_files(
    articles: list[Article], n_facts: int | None, source: str, what: str = "articles"
) -> tuple[dict[str, bytes], dict[str, Any]]:
    """The data files and manifest entries (without ``sources``) of ``articles``, the first
    ``n_facts`` of them (None: all); ``source`` and ``what`` name the input and its items
    in messages. Shared by the articles and the relation datasets."""
    if n_facts is not None:
        if n_facts > len(articles):
            raise DatasetError(
                f"n_facts {n_facts} asks for more {what} than {source} has "
                f"({len(articles)}); choose n_facts between 1 and {len(articles)}",
                "n_facts",
            )
        articles = articles[:n_facts]
    train = [r for i, a in enumerate(articles) for r in _train_records(i, a)]
    tests = [r for i, a in enumerate(articles) for r in _test_records(i, a)]
    if not tests:
        raise DatasetError(
            f"the first {len(articles)} {what} of {source} have no questions; "
            "raise n_facts or give them questions",
            "n_facts",
        )
    unlearnable = [q for a in articles for q in _unlearnable(a)]
    if unlearnable:
        logger.warning(
            "%d of %d questions have an answer that neither their article nor its rephrases "
            "contain (%s): the donor can only learn it from another article",
            len(unlearnable),
            len(tests),
            ", ".join(unlearnable[:5]),
        )
    files = {
        "articles.jsonl": jsonl_bytes(asdict(a) for a in articles),
        "train.jsonl": jsonl_bytes(train),
        "test_prompts.jsonl": jsonl_bytes(tests),
    }
    manifest = {
        "sizes": {
            "facts": len(articles),
            "articles": len(articles),
            "train": len(train),
            "test_prompts": len(tests),
        },
        "templates": {"test": sorted({r["template"] for r in tests})},
        "answers_not_in_their_article": unlearnable,
        "test_set": "all",
    }
    return files, manifest


def article_names(dataset_dir: str | Path) -> set[str]:
    """The names of an articles dataset: every question's answer and first entity (what the
    top-1 kinds of a run call the dataset's names, as a movie dataset's actors)."""
    names = set()
    for record in read_jsonl(Path(dataset_dir) / "test_prompts.jsonl"):
        start, end = record["fields"]["FE"]
        names |= {record["target"], record["text"][start:end]}
    return names
