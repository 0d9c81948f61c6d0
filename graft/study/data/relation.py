"""A dataset of facts of any relation (person -> employer, city -> country, drug -> target):
subjects and objects from a table, sentences from templates, as ROME's CounterFact.

The input is one TOML file (format: :func:`read_relation`)::

    name = "employer"                  # optional; default the file's stem
    facts = "people.csv"               # CSV or JSONL: subject, object (+ more columns)
    train = ["{subject} works at {object}.", "At {object}, {subject} leads a team."]
    [test]                             # template name -> text ending with {object}
    cloze = "{subject} works at {object}"
    qa = "Q: Where does {subject} work?\\nA: {object}"

Each fact (a row of the facts file) is rendered into one article of
:mod:`graft.study.data.articles` in memory: its training texts are the train templates
filled with the row (``{subject}``, ``{object}`` and any other column as ``{column}``;
other braces are kept as they are), its questions the test templates filled up to
``{object}``: the prompt is the text before it (stripped), the answer the object, the first
entity (FE) the subject, the template the test template's name. So the dataset folder is an
articles dataset's, which every experiment reads. LT is the prompt's last token.

Everything is checked before anything is written, each problem one line naming the file,
row or template and the fix (:class:`DatasetError`, ``param`` ``relation_path``). A row
that repeats an earlier row exactly is left out, said in one warning line and listed in the
manifest (``dropped_row_numbers``); another row of the same subject is an error.
"""

from __future__ import annotations

import logging
import re
import tomllib
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any

from graft.errors import DatasetError
from graft.naming import slug
from graft.storage.files import refuse_special
from graft.study.data.articles import (
    TEMPLATE_NAME,
    Article,
    Question,
    articles_files,
    entity_span,
)
from graft.study.data.facts_file import dropped_line, read_rows
from graft.study.data.files import RESOURCES
from graft.study.specs.config import DatasetConfig

logger = logging.getLogger(__name__)

#: The dataset kind of a relation file (:class:`DatasetConfig` ``kind``).
RELATION_KIND = "relation"
#: The generator version of a relation dataset (recorded in its manifest).
RELATION_GENERATOR = "graft.relation/1"
#: The shipped example: invented people and the invented companies they work at.
EXAMPLE_RELATION = RESOURCES / "relations" / "employer.toml"

_KEYS = ("name", "facts", "train", "test")
_PARAM = "relation_path"
_FIELD = re.compile(r"\{(\w+)\}")
_OBJECT = "{object}"


@dataclass
class Relation:
    """A relation file, read and checked.

    Args:
        name: the relation's name (the file's stem unless given).
        path: the TOML file.
        facts_path: its facts file.
        train: the training templates.
        test: test template name -> its prompt template (the text before ``{object}``).
        rows: the facts, each ``{column: value}`` (stripped) with its row number under
            ``"_row"`` (1 for the first row under a CSV's header or a JSONL's first object).
        dropped: row numbers left out (each repeats an earlier row).
        n_rows: the facts file's rows, those left out included.
    """

    name: str
    path: Path
    facts_path: Path
    train: list[str]
    test: dict[str, str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    n_rows: int = 0


def _fail(message: str) -> DatasetError:
    return DatasetError(message, _PARAM)


def _render(template: str, values: dict[str, Any]) -> str:
    """``template`` with each ``{field}`` replaced by its value."""
    return _FIELD.sub(lambda m: str(values[m[1]]), template)


def _read_toml(path: Path) -> dict[str, Any]:
    refuse_special(path)  # a FIFO would wait for a writer forever
    if not path.is_file():
        raise _fail(f"relation file {path} does not exist; pass an existing TOML file")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise _fail(f"cannot read relation file {path}: {type(e).__name__}") from None
    except tomllib.TOMLDecodeError as e:
        raise _fail(f"{path} is not valid TOML ({e}); fix the file") from None


def _templates(path: Path, data: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """The train templates and the test prompts' templates of a relation file, checked."""
    train = data.get("train")
    if not isinstance(train, list) or not train:
        raise _fail(f"{path}: 'train' must be a non-empty list of template texts")
    for i, t in enumerate(train, 1):
        if not isinstance(t, str) or not t.strip():
            raise _fail(f"{path}: train template {i} must be a non-empty text")
    test = data.get("test")
    if not isinstance(test, dict) or not test:
        raise _fail(
            f"{path}: give a [test] table of name = text ending with {_OBJECT}, e.g. "
            'cloze = "{subject} works at {object}"'
        )
    prompts = {}
    for name, text in test.items():
        where = f"{path}, test template {name!r}"
        if not TEMPLATE_NAME.fullmatch(name):
            raise _fail(f"{where}: the name may hold letters, digits, '_' and '-' only")
        if not isinstance(text, str) or not text.rstrip().endswith(_OBJECT):
            raise _fail(f"{where} must end with {_OBJECT}: the prompt is the text before it")
        prompt = text.rstrip()[: -len(_OBJECT)]
        if "{subject}" not in prompt:
            raise _fail(f"{where} lacks {{subject}}: its prompt must name the subject (FE)")
        if _OBJECT in prompt:
            raise _fail(f"{where} holds {_OBJECT} before its end: the prompt would give it away")
        prompts[name] = prompt
    return [t.strip() for t in train], prompts


def _check_fields(relation: Relation, columns: set[str]) -> None:
    """Every ``{field}`` of a template is a column of the facts file."""
    named = [(f"train template {i}", t) for i, t in enumerate(relation.train, 1)]
    named += [(f"test template {n!r}", t) for n, t in relation.test.items()]
    for where, template in named:
        for name in _FIELD.findall(template):
            if name not in columns:
                raise _fail(
                    f"{relation.path}, {where}: no row of {relation.facts_path.name} has "
                    f"{{{name}}} (its columns: {', '.join(sorted(columns))}); add the column "
                    "or fix the name"
                )


def _row_values(where: str, row: Any) -> dict[str, str]:
    """One row's values as stripped texts (a CSV row's missing values empty)."""
    if not isinstance(row, dict):
        raise _fail(f"{where} must be an object of column: value, not {type(row).__name__}")
    if None in row:
        raise _fail(f"{where} has more values than the header has columns; quote values with ','")
    return {str(k): "" if v is None else str(v).strip() for k, v in row.items()}


def _facts(relation: Relation) -> None:
    """Read, check and keep ``relation``'s facts (the repeated rows left out)."""
    if not relation.facts_path.is_file():
        raise _fail(
            f"{relation.path}: facts file {relation.facts_path} does not exist; give 'facts' "
            f"as a path relative to {relation.path.parent}"
        )
    raw = read_rows(relation.facts_path, _PARAM, "facts file")
    if not raw:
        raise _fail(f"facts file {relation.facts_path} has no rows; give one fact per row")
    rows = [_row_values(f"{relation.facts_path}, row {n}", r) for n, r in enumerate(raw, 1)]
    columns = {k for r in rows for k in r}
    lacking = [c for c in ("subject", "object") if c not in columns]
    if lacking:
        raise _fail(
            f"facts file {relation.facts_path} has no column {lacking[0]!r} (its columns: "
            f"{', '.join(sorted(columns))}); name the columns subject and object"
        )
    _check_fields(relation, columns)
    used = {f for t in [*relation.train, *relation.test.values()] for f in _FIELD.findall(t)}
    seen: dict[str, tuple[int, dict[str, str]]] = {}
    for n, row in enumerate(rows, 1):
        where = f"{relation.facts_path}, row {n}"
        for name in sorted({"subject", "object"} | used):
            if not row.get(name):
                raise _fail(f"{where}: {name!r} is empty; fill it in or drop the row")
        if row["subject"] in seen:
            first, earlier = seen[row["subject"]]
            if earlier == row:
                relation.dropped.append(n)
                continue
            raise _fail(
                f"{where}: subject {row['subject']!r} is also the subject of row {first}; "
                "give each subject one fact (drop or rename one)"
            )
        seen[row["subject"]] = (n, row)
        relation.rows.append({**row, "_row": n})
    relation.n_rows = len(rows)


def read_relation(path: str | Path) -> Relation:
    """The relation file at ``path`` (format: the module docstring) with its facts, checked.

    Raises:
        DatasetError: a file is missing or unreadable; the TOML has an unknown key, no train
            templates or no test templates; a test template does not end with ``{object}``
            or lacks ``{subject}``; a template names a field no column has; a row's subject,
            object or used field is empty; a subject is not a whole word of its rendered
            test prompt; two rows share a subject (with other values). One line, naming the
            file, row or template and the fix.
    """
    path = Path(path)
    data = _read_toml(path)
    unknown = sorted(set(data) - set(_KEYS))
    if unknown:
        raise _fail(f"{path}: unknown key {unknown[0]!r}; the keys are {', '.join(_KEYS)}")
    name = data.get("name", path.stem)
    facts = data.get("facts")
    if not isinstance(name, str) or not name.strip():
        raise _fail(f"{path}: 'name' must be a non-empty text")
    if not isinstance(facts, str) or not facts.strip():
        raise _fail(f"{path}: 'facts' must name the facts file (CSV or JSONL), e.g. 'people.csv'")
    train, test = _templates(path, data)
    relation = Relation(name.strip(), path, path.parent / facts.strip(), train, test)
    _facts(relation)
    return relation


def _article(relation: Relation, row: dict[str, Any]) -> Article:
    """The article of one fact: its rendered train templates and test questions."""
    texts = [_render(t, row) for t in relation.train]
    questions = []
    for template, prompt_template in relation.test.items():
        prompt = _render(prompt_template, row).strip()
        span = entity_span(prompt, row["subject"])
        if span is None:
            raise _fail(
                f"{relation.facts_path}, row {row['_row']}: subject {row['subject']!r} is not "
                f"a whole word of its test prompt {template!r} ({prompt!r}); move the text "
                "after {subject} out of the word"
            )
        questions.append(Question(prompt, row["object"], row["subject"], template, span))
    source = f"{relation.facts_path.name}, row {row['_row']}"
    return Article(f"row{row['_row']}", texts[0], texts[1:], questions, source)


def relation_articles(relation: Relation) -> list[Article]:
    """The articles of a relation's facts, one per fact, in the file's order."""
    return [_article(relation, row) for row in relation.rows]


def relation_digest(relation: Relation) -> str:
    """The SHA-256 (hex) of a relation's TOML file and its facts file together."""
    digest = sha256(relation.path.read_bytes())
    digest.update(b"\0" + relation.facts_path.read_bytes())
    return digest.hexdigest()


def relation_dataset_name(config: DatasetConfig) -> str:
    """``relation-<name>-<sha256 of the TOML and facts files, 8 digits>-n<N or all>``: the
    workspace folder of a relation dataset; an edited file makes a new dataset."""
    assert config.relation_path is not None
    relation = read_relation(config.relation_path)
    n = "all" if config.n_facts is None else config.n_facts
    return f"relation-{slug(relation.name)}-{relation_digest(relation)[:8]}-n{n}"


def relation_dataset(config: DatasetConfig) -> tuple[dict[str, bytes], dict[str, Any]]:
    """The data files of a relation dataset (an articles dataset's) and its manifest's
    entries (:func:`graft.study.data.articles.articles_files`, plus the relation's
    templates, its dropped rows and its two files with their SHA-256)."""
    assert config.relation_path is not None  # validate_config checked it
    relation = read_relation(config.relation_path)
    if relation.dropped:
        dropped = {"repeated_row": relation.dropped}
        logger.warning("%s", dropped_line(relation.facts_path, relation.n_rows, dropped))
    articles = relation_articles(relation)
    files, manifest = articles_files(
        articles, config.n_facts, str(relation.facts_path), what="facts"
    )
    tests = {name: prompt + _OBJECT for name, prompt in relation.test.items()}
    manifest["relation"] = {"name": relation.name, "train": relation.train, "test": tests}
    manifest["dropped_row_numbers"] = {"repeated_row": relation.dropped}
    manifest["sources"] = {
        "relation_path": str(relation.path),
        "relation_sha256": sha256(relation.path.read_bytes()).hexdigest(),
        "relation_facts_path": str(relation.facts_path),
        "relation_facts_sha256": sha256(relation.facts_path.read_bytes()).hexdigest(),
    }
    return files, manifest
