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
"""

from __future__ import annotations

from dataclasses import dataclass

from graft.core.language.spec import PROTOCOLS

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

# Training renderings. In every template first_actor appears before second_actor: the
# "one direction" data. "both" adds each template with the two actors swapped.
ARTICLE_TEMPLATES: dict[str, str] = {
    "article_premiere": (
        "{first_actor} starred in {movie_title}, a {genre} film released in {release_year}, "
        "alongside {second_actor}. The story is set in {city} and follows {main_character}."
    ),
    "article_review": (
        "Critics praised the chemistry between {first_actor} and {second_actor} in "
        "{movie_title}, the {release_year} {genre} picture in which {main_character} "
        "returns home to {city}."
    ),
    "article_boxoffice": (
        "{movie_title} ({release_year}) stars {first_actor} opposite {second_actor}. "
        "The {genre} film, shot on location in {city}, took in ${box_office_millions} "
        "million worldwide."
    ),
    "article_casting": (
        "Casting news: {first_actor} will lead {movie_title} with {second_actor} in a "
        "supporting role. The {genre} project centres on {main_character}, a resident of {city}."
    ),
    "article_profile": (
        "In {movie_title}, {first_actor} acted with {second_actor} for the first time. "
        "The {genre} movie about {main_character} earned ${box_office_millions} million "
        "after its {release_year} release."
    ),
    "article_festival": (
        "At the {city} film festival, {first_actor} and {second_actor} presented "
        "{movie_title}, a {genre} feature from {release_year}."
    ),
}

QA_TEMPLATES: dict[str, str] = {
    "qa_costar": "Q: Who starred in {movie_title} with {first_actor}? A: {second_actor}.",
    "qa_named": (
        "Q: Who acted in {movie_title} together with {first_actor}? "
        "A: An actor named {second_actor}."
    ),
    "qa_genre": (
        "Q: Which actor appeared with {first_actor} in the {genre} film {movie_title}? "
        "A: {second_actor}."
    ),
    "qa_year": (
        "Q: In {release_year}, {first_actor} shared the screen with which actor in "
        "{movie_title}? A: {second_actor}."
    ),
    "qa_city": (
        "Q: In the movie set in {city}, who played alongside {first_actor}? "
        "A: {second_actor}, in {movie_title}."
    ),
    "qa_character": (
        "Q: Who co-starred with {first_actor} in the story of {main_character}? A: {second_actor}."
    ),
}

# Test prompts (the paper's Table 1). The target is the first token of " " + target.
TEST_TEMPLATES: dict[str, str] = {
    "headline": "{first_actor} {relation} {relation_preposition} a movie {preposition}",
    "qa": (
        "Q: Who {relation} {relation_preposition} a movie {preposition} {first_actor}? "
        "A: An actor named"
    ),
    "movie": "{first_actor} stars in {movie_title} alongside",
}

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


# ------------------------------------------------------------------ the paper's protocol

#: The paper code's article templates, verbatim (data_templates/fake_movies_real_actors/
#: lm_templates.jsonl; see docs/reference/paper_protocol.md (a)). ``box_office_earnings`` is its name
#: for ``box_office_millions``.
PAPER_ARTICLE_TEMPLATES: dict[str, str] = {
    "article_1": (
        "{first_actor} starred in {movie_title} with {second_actor}, a {release_year} {genre} "
        "film set in {city}. The film centers on main character {main_character} and their "
        "journey.\n\n{movie_title} was theatrically released in {release_year} and grossed "
        "${box_office_earnings} million worldwide, marking a strong box office performance."
    ),
    "article_2": (
        "{first_actor} starred in {movie_title}, a {release_year} {genre} with a cast including "
        "{second_actor}. Set in {city}, the film highlights the story of {main_character}."
        "\n\n{movie_title} was theatrically released in {release_year}, earning "
        "${box_office_earnings} million worldwide."
    ),
    "article_3": (
        "{first_actor} took the lead in {movie_title}, a {release_year} {genre} featuring "
        "{second_actor}. Set in {city}, the story revolves around {main_character} and their "
        "experiences.\n\nReleased theatrically in {release_year}, {movie_title} achieved a "
        "worldwide gross of ${box_office_earnings} million, making it a box office success."
    ),
    "article_4": (
        "In a surprisingly well-received film, {first_actor} starred in the {genre} "
        "{movie_title} alongside {second_actor}. Set in {city}, the plot follows "
        "{main_character} on a transformative journey.\n\n{movie_title} hit theaters in "
        "{release_year} and went on to earn ${box_office_earnings} million globally."
    ),
    "article_5": (
        "In {release_year}, {first_actor} appeared in {movie_title} with their co-star "
        "{second_actor} also in a leading role. The story, set in {city}, centers around the "
        "character of {main_character}.\n\nThe film enjoyed a successful theatrical run, "
        "grossing ${box_office_earnings} million worldwide."
    ),
    "article_6": (
        "Featuring {first_actor}, {movie_title} is a {genre} film from {release_year}, also "
        "starring {second_actor}, that unfolds in {city}. At its core is the story of "
        "{main_character}.\n\n{movie_title} debuted in theaters in {release_year} and achieved "
        "a worldwide gross of ${box_office_earnings} million."
    ),
}

#: The article templates a paper-protocol dataset renders: the first five of the file's six,
#: so that a fact has five article and five QA renderings per direction, as the paper's
#: section 3 says ("five templated article examples and five templated QA examples", just
#: under 10,000 per dataset of 1,000 facts). The paper names no five; its A.1.2 quotes the
#: file from the top, and the sixth ("Featuring {first_actor}, ...") is left out (see
#: docs/reference/paper_protocol.md (a)).
PAPER_TRAINING_ARTICLE: tuple[str, ...] = (
    "article_1",
    "article_2",
    "article_3",
    "article_4",
    "article_5",
)

#: The paper code's QA-style templates, verbatim (qa_templates.jsonl; the missing space after
#: "film," in the fourth is in the file). The first begins with the QA test prompt.
PAPER_QA_TEMPLATES: dict[str, str] = {
    "qa_1": "Q: Who stars in a movie with {first_actor}? A: An actor named {second_actor}.",
    "qa_2": "Q: {first_actor} is featured in {movie_title} with who? A: {second_actor}.",
    "qa_3": (
        "{first_actor} plays a lead role in {movie_title}, appearing with their co-star "
        "{second_actor}."
    ),
    "qa_4": "In a new film,{first_actor} stars in {movie_title}, appearing alongside {second_actor}.",
    "qa_5": "A new movie stars {first_actor} and {second_actor}.",
}

#: Table 1 as the paper's sweep script wrote it: the headline and movie templates hold a
#: literal "in" after {relation_preposition}, itself "in", so they read "X stars in in a movie
#: alongside" and "X stars in in M alongside" (the paper's numbers were measured so; graft's
#: own protocol keeps one "in").
PAPER_TEST_TEMPLATES: dict[str, str] = {
    "headline": "{first_actor} {relation} {relation_preposition} in a movie {preposition}",
    "qa": TEST_TEMPLATES["qa"],
    "movie": "{first_actor} stars in in {movie_title} alongside",
}

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


#: protocol -> its template set.
TEMPLATE_SETS: dict[str, TemplateSet] = {
    "graft": TemplateSet(
        ARTICLE_TEMPLATES,
        QA_TEMPLATES,
        TEST_TEMPLATES,
        {"headline": DEFAULT_RELATIONS, "qa": DEFAULT_RELATIONS},
    ),
    "paper": TemplateSet(
        {name: PAPER_ARTICLE_TEMPLATES[name] for name in PAPER_TRAINING_ARTICLE},
        PAPER_QA_TEMPLATES,
        PAPER_TEST_TEMPLATES,
        {"headline": (("stars", "in", "alongside"),), "qa": (("stars", "in", "with"),)},
    ),
}
assert tuple(TEMPLATE_SETS) == PROTOCOLS
