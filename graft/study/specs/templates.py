"""What the paper's dataset texts look like: training and test templates, relations, fields.

Training renderings (:data:`ARTICLE_TEMPLATES`, :data:`QA_TEMPLATES`) name first_actor before
second_actor: the "one direction" data; ``direction="both"`` adds each with the two actors
swapped. Test prompts (:data:`TEST_TEMPLATES`, the paper's Table 1) are stored as text plus
the character span of each field; their target is the first token of ``" " + target``.

Two template sets (:data:`TEMPLATE_SETS`, keyed by protocol): ``graft`` (the default: graft's
own paraphrases for training, six article and six QA, Table 1 filled as ``X starred in a
movie with``) and ``paper`` (the paper code's data files verbatim,
:data:`PAPER_ARTICLE_TEMPLATES` and :data:`PAPER_QA_TEMPLATES`, of which a dataset renders
five article (:data:`PAPER_TRAINING_ARTICLE`) and five QA templates per fact and direction,
as the paper's text says, and Table 1 filled as its code filled it, doubled "in" included:
``X stars in in a movie alongside``, ``X stars in in M alongside``). ``docs/reference/paper_protocol.md``
gives the sources.

The templates are data: each set is read from its file, ``graft/resources/relations/movies.toml``
and ``movies-paper.toml`` (:data:`MOVIE_TEMPLATE_FILES`), relation files without their facts
line (:mod:`graft.study.specs.template_file`), written with ``{subject}`` (first_actor) and
``{object}`` (second_actor); so a movie dataset is an instance of the relation format.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from graft.core.language.spec import PROTOCOLS
from graft.errors import DatasetError
from graft.study.specs.template_file import read_templates

#: The shipped relation files, the movie datasets' templates among them.
RELATIONS = Path(__file__).parents[2] / "resources" / "relations"
#: The training styles of a movie template file, in the order a fact renders them.
MOVIE_STYLES = ("article", "qa")

#: Training directions: ``one`` (first_actor always first) or ``both`` (also swapped).
DIRECTIONS = ("one", "both")

GENRES = (
    "action",
    "comedy",
    "drama",
    "science fiction",
    "horror",
    "romance",
    "thriller",
    "adventure",
    "fantasy",
    "mystery",
)

# (relation, relation_preposition, preposition) of the headline and QA test prompts.
DEFAULT_RELATIONS: tuple[tuple[str, str, str], ...] = (("starred", "in", "with"),)

FACT_TEXT_FIELDS = (
    "movie_title",
    "first_actor",
    "second_actor",
    "main_character",
    "city",
    "genre",
    "release_year",
    "box_office_millions",
)
OPTIONAL_METADATA = ("main_character", "city", "genre", "release_year", "box_office_millions")


Relation = tuple[str, str, str]


@dataclass(frozen=True)
class TemplateSet:
    """The texts of one protocol.

    Args:
        article: article-style training templates, name -> template.
        qa: QA-style training templates, name -> template.
        test: test prompt templates (Table 1), name -> template.
        relations: test template -> its (relation, relation_preposition, preposition)
            fillings, used when the dataset config names none.
    """

    article: dict[str, str]
    qa: dict[str, str]
    test: dict[str, str]
    relations: dict[str, tuple[Relation, ...]]


def _movie_vocabulary(template: str) -> str:
    """A template file's text in the movie facts' field names (subject: first_actor,
    object: second_actor)."""
    return template.replace("{subject}", "{first_actor}").replace("{object}", "{second_actor}")


def movie_template_set(path: Path) -> TemplateSet:
    """The template set of a movie template file (a relation file's templates, format:
    :mod:`graft.study.specs.template_file`, its train templates in the styles ``article``
    and ``qa``), in the movie facts' field names; its test templates are the text before
    ``{object}``, stripped at the end.

    Raises:
        DatasetError: a bad file, or a train style other than ``article`` and ``qa``.
    """
    templates = read_templates(path)
    styles = sorted({style for style, _, _ in templates.train} - set(MOVIE_STYLES))
    if styles:
        raise DatasetError(
            f"{path}: train style {styles[0]!r} is no movie style; use {' and '.join(MOVIE_STYLES)}",
            "templates",
        )
    article, qa = (
        {name: _movie_vocabulary(t) for name, t in templates.style(style).items()}
        for style in MOVIE_STYLES
    )
    test = {name: _movie_vocabulary(t).rstrip() for name, t in templates.test.items()}
    return TemplateSet(article, qa, test, dict(templates.relations))


#: The movie template files (relation files without facts), by protocol.
MOVIE_TEMPLATE_FILES: dict[str, Path] = {
    "graft": RELATIONS / "movies.toml",
    "paper": RELATIONS / "movies-paper.toml",
}
#: protocol -> its template set, read from its file.
TEMPLATE_SETS: dict[str, TemplateSet] = {
    name: movie_template_set(path) for name, path in MOVIE_TEMPLATE_FILES.items()
}
assert tuple(TEMPLATE_SETS) == PROTOCOLS

#: graft's training and test templates (its file's).
ARTICLE_TEMPLATES = TEMPLATE_SETS["graft"].article
QA_TEMPLATES = TEMPLATE_SETS["graft"].qa
TEST_TEMPLATES = TEMPLATE_SETS["graft"].test
#: The paper code's article templates, verbatim (data_templates/fake_movies_real_actors/
#: lm_templates.jsonl; see docs/reference/paper_protocol.md (a)): the five a paper-protocol
#: dataset renders, then the sixth, which it leaves out (its file's ``[unrendered]``), so
#: that a fact has five article and five QA renderings per direction, as the paper's section
#: 3 says ("five templated article examples and five templated QA examples", just under
#: 10,000 per dataset of 1,000 facts). The paper names no five; its A.1.2 quotes the file
#: from the top. ``box_office_earnings`` is its name for ``box_office_millions``.
PAPER_ARTICLE_TEMPLATES: dict[str, str] = {
    **TEMPLATE_SETS["paper"].article,
    **{
        name: _movie_vocabulary(t)
        for name, t in read_templates(MOVIE_TEMPLATE_FILES["paper"]).unrendered["article"].items()
    },
}
#: The article templates a paper-protocol dataset renders.
PAPER_TRAINING_ARTICLE: tuple[str, ...] = tuple(TEMPLATE_SETS["paper"].article)
#: The paper code's QA-style templates, verbatim (qa_templates.jsonl).
PAPER_QA_TEMPLATES = TEMPLATE_SETS["paper"].qa
#: Table 1 as the paper's sweep script wrote it: the headline and movie templates hold a
#: literal "in" after {relation_preposition}, itself "in", so they read "X stars in in a movie
#: alongside" and "X stars in in M alongside" (the paper's numbers were measured so; graft's
#: own protocol keeps one "in").
PAPER_TEST_TEMPLATES = TEMPLATE_SETS["paper"].test
