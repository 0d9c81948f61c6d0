"""A fact's texts: its training renderings (every article and QA template of a protocol's
template set, in one or both directions) and its test prompts (every test template, forward
and reversed, with the fields' character spans)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from graft.core.language.spans import render, template_fields
from graft.study.data.facts import Fact
from graft.study.specs.config import DatasetConfig
from graft.study.specs.templates import TEMPLATE_SETS, Relation, TemplateSet

#: graft's own templates, the default.
GRAFT_TEXTS = TEMPLATE_SETS["graft"]


def _fact_fields(fact: Fact, reverse: bool = False) -> dict[str, Any]:
    values = asdict(fact)
    # the paper's templates name the box office ``box_office_earnings``
    values["box_office_earnings"] = fact.box_office_millions
    if reverse:
        values["first_actor"], values["second_actor"] = fact.second_actor, fact.first_actor
    return values


def render_training(
    fact: Fact, direction: str = "one", texts: TemplateSet = GRAFT_TEXTS
) -> list[dict[str, Any]]:
    """Training records of one fact: every article and QA template of ``texts`` (a
    protocol's templates), forward and (with ``direction="both"``) reverse. Keys: text, fact_id, set,
    style, template, direction."""
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
    texts = config.texts
    directions = 2 if config.direction == "both" else 1
    per_direction = len(texts.article) + len(texts.qa)
    return {"article": len(texts.article), "qa": len(texts.qa), "total": directions * per_direction}


def render_test_prompts(
    fact: Fact, relations: Sequence[Relation] | None = None, texts: TemplateSet = GRAFT_TEXTS
) -> list[dict[str, Any]]:
    """Test prompt records of one fact, forward (target second_actor) and reverse (the
    actors swapped: first_actor is the fact's second actor, target its first actor).

    ``relations`` fill every template that has a relation; ``None``: ``texts``' fillings
    per template (the paper's: ``X stars in in a movie alongside``, ``Q: Who stars in a
    movie with X? A: An actor named``, ``X stars in in M alongside``)."""
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
