"""The templates of a relation file, read and checked: how a fact of a relation is written.

A relation file (:mod:`graft.study.data.relation`) is a facts file plus these templates; the
movie datasets' templates are relation files without the facts line
(``graft/resources/relations/movies.toml`` and ``movies-paper.toml``, read by
:mod:`graft.study.specs.templates`). The keys (``+``: the superset the movie files use, which
a relation file may use too)::

    train = ["{subject} works at {object}.", ...]   # the training texts' templates, or (+)
    [train.article]                                  # one table per style, name = template,
    article_1 = "{subject} starred in ..."           # in the file's order
    [test]                                           # name = text ending with {object}
    headline = "{subject} {relation} {relation_preposition} a movie {preposition} {object}"
    [relations]                                      # (+) a test template's fillings of
    headline = [["starred", "in", "with"]]           # {relation} {relation_preposition} {preposition}
    [unrendered.article]                             # (+) templates kept with the file's
    article_6 = "..."                                # others but not rendered

``{subject}`` and ``{object}`` are the fact's two sides (FE is the subject; a test prompt is
its template's text before ``{object}``, whose answer is the object); any other ``{field}``
is a column of the facts (or a filling of ``[relations]``).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graft.errors import DatasetError
from graft.storage.files import refuse_special

#: The keys a template file may have beyond a relation file's ``name`` and ``facts``.
TEMPLATE_KEYS = ("train", "test", "relations", "unrendered")
#: The fields a filling of ``[relations]`` gives, in its order.
FILLING_FIELDS = ("relation", "relation_preposition", "preposition")
#: The style of a ``train`` given as a list.
LIST_STYLE = "train"
#: What a template or style name may be: letters, digits, "_" and "-", a letter or digit first.
TEMPLATE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")

_OBJECT = "{object}"


@dataclass(frozen=True)
class Templates:
    """A template file's templates, checked.

    Args:
        train: the training templates as ``(style, name, template)``, in the file's order (a
            list's: style :data:`LIST_STYLE`, names ``train1``, ``train2``, ...).
        test: test template name -> its prompt template (the text before ``{object}``, as
            written: the caller strips the rendered prompt).
        relations: test template name -> its ``(relation, relation_preposition,
            preposition)`` fillings (``[relations]``; empty without).
        unrendered: style -> name -> template kept in the file but never rendered.
    """

    train: tuple[tuple[str, str, str], ...]
    test: dict[str, str]
    relations: dict[str, tuple[tuple[str, str, str], ...]] = field(default_factory=dict)
    unrendered: dict[str, dict[str, str]] = field(default_factory=dict)

    def train_texts(self) -> list[str]:
        """The training templates alone, in order."""
        return [template for _, _, template in self.train]

    def style(self, name: str) -> dict[str, str]:
        """The training templates of style ``name``: template name -> template."""
        return {n: t for s, n, t in self.train if s == name}


def read_toml(path: Path, param: str, what: str = "relation file") -> dict[str, Any]:
    """The TOML file at ``path``, parsed.

    Raises:
        DatasetError: the file is missing, unreadable or not TOML (one line, ``param``).
    """
    refuse_special(path)  # a FIFO would wait for a writer forever
    if not path.is_file():
        raise DatasetError(f"{what} {path} does not exist; pass an existing TOML file", param)
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise DatasetError(f"cannot read {what} {path}: {type(e).__name__}", param) from None
    except tomllib.TOMLDecodeError as e:
        raise DatasetError(f"{path} is not valid TOML ({e}); fix the file", param) from None


def _train(path: Path, data: dict[str, Any], fail: Any) -> tuple[tuple[str, str, str], ...]:
    train = data.get("train")
    if isinstance(train, list) and train:
        named = [(LIST_STYLE, f"train{i}", t) for i, t in enumerate(train, 1)]
    elif isinstance(train, dict) and train:
        named = []
        for style, table in train.items():
            if not TEMPLATE_NAME.fullmatch(style) or not isinstance(table, dict) or not table:
                raise fail(
                    f"{path}: train style {style!r} must be a table of name = template "
                    "([train.article]), its name letters, digits, '_' and '-'"
                )
            for name, t in table.items():
                if not TEMPLATE_NAME.fullmatch(name):
                    raise fail(
                        f"{path}: train template {name!r} may hold letters, digits, '_' and '-' only"
                    )
                named.append((style, name, t))
    else:
        raise fail(f"{path}: 'train' must be a non-empty list of template texts")
    for i, (_, name, t) in enumerate(named, 1):
        label = i if isinstance(train, list) else repr(name)
        if not isinstance(t, str) or not t.strip():
            raise fail(f"{path}: train template {label} must be a non-empty text")
    return tuple((s, n, t.strip()) for s, n, t in named)


def _test(path: Path, data: dict[str, Any], fail: Any) -> dict[str, str]:
    test = data.get("test")
    if not isinstance(test, dict) or not test:
        raise fail(
            f"{path}: give a [test] table of name = text ending with {_OBJECT}, e.g. "
            'cloze = "{subject} works at {object}"'
        )
    prompts = {}
    for name, text in test.items():
        where = f"{path}, test template {name!r}"
        if not TEMPLATE_NAME.fullmatch(name):
            raise fail(f"{where}: the name may hold letters, digits, '_' and '-' only")
        if not isinstance(text, str) or not text.rstrip().endswith(_OBJECT):
            raise fail(f"{where} must end with {_OBJECT}: the prompt is the text before it")
        prompt = text.rstrip()[: -len(_OBJECT)]
        if "{subject}" not in prompt:
            raise fail(f"{where} lacks {{subject}}: its prompt must name the subject (FE)")
        if _OBJECT in prompt:
            raise fail(f"{where} holds {_OBJECT} before its end: the prompt would give it away")
        prompts[name] = prompt
    return prompts


def _relations(
    path: Path, data: dict[str, Any], test: dict[str, str], fail: Any
) -> dict[str, tuple[tuple[str, str, str], ...]]:
    table = data.get("relations", {})
    if not isinstance(table, dict):
        raise fail(f"{path}: [relations] must be a table of test template = fillings")
    fillings = {}
    for name, rows in table.items():
        where = f"{path}, [relations] {name!r}"
        if name not in test:
            raise fail(f"{where}: no test template has this name; name one of {', '.join(test)}")
        ok = (
            isinstance(rows, list)
            and bool(rows)
            and all(
                isinstance(r, list) and len(r) == 3 and all(isinstance(v, str) and v for v in r)
                for r in rows
            )
        )
        if not ok:
            raise fail(
                f"{where} must be a non-empty list of [{', '.join(FILLING_FIELDS)}] texts, "
                'e.g. [["starred", "in", "with"]]'
            )
        fillings[name] = tuple((r[0], r[1], r[2]) for r in rows)
    return fillings


def _unrendered(path: Path, data: dict[str, Any], fail: Any) -> dict[str, dict[str, str]]:
    table = data.get("unrendered", {})
    ok = isinstance(table, dict) and all(
        isinstance(t, dict) and all(isinstance(v, str) for v in t.values()) for t in table.values()
    )
    if not ok:
        raise fail(
            f"{path}: [unrendered] must hold tables of name = template ([unrendered.article])"
        )
    return {style: dict(t) for style, t in table.items()}


def parse_templates(path: Path, data: dict[str, Any], param: str) -> Templates:
    """The templates of the parsed template file ``data`` (read from ``path``), checked.

    Raises:
        DatasetError: no train templates or an empty one; no test templates, or one that does
            not end with ``{object}``, lacks ``{subject}`` or holds ``{object}`` earlier; a bad
            name; a ``[relations]`` entry that names no test template or is not a list of
            three texts; a bad ``[unrendered]``. One line naming the file and template and
            the fix, ``param`` as given.
    """

    def fail(message: str) -> DatasetError:
        return DatasetError(message, param)

    train = _train(path, data, fail)
    test = _test(path, data, fail)
    return Templates(train, test, _relations(path, data, test, fail), _unrendered(path, data, fail))


def read_templates(path: str | Path, param: str = "templates") -> Templates:
    """The templates of the template file at ``path`` (format: the module docstring); it
    may have no keys other than :data:`TEMPLATE_KEYS`.

    Raises:
        DatasetError: a missing, unreadable or bad file (:func:`parse_templates`), or an
            unknown key.
    """
    path = Path(path)
    data = read_toml(path, param, "template file")
    unknown = sorted(set(data) - set(TEMPLATE_KEYS))
    if unknown:
        raise DatasetError(
            f"{path}: unknown key {unknown[0]!r}; the keys are {', '.join(TEMPLATE_KEYS)}", param
        )
    return parse_templates(path, data, param)
