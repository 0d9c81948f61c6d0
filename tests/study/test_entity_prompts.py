"""``graft.study.entity_prompts``: a dataset's stored test prompts of one template and
direction as (text, target, first entity), in file order, the first n; bad requests are one
error naming what to fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graft.errors import DatasetError
from graft.study import entity_prompts


def _record(i: int, template: str, direction: str, actor: str, other: str) -> dict:
    text = (
        f"{actor} starred in a movie with"
        if template == "headline"
        else f"Q: Who starred with {actor}? A:"
    )
    start = text.index(actor)
    return {
        "id": f"{i}:{template}:{direction}",
        "fact_id": i,
        "template": template,
        "direction": direction,
        "text": text,
        "fields": {"first_actor": [start, start + len(actor)]},
        "target_text": f" {other}",
    }


def dataset(folder: Path) -> Path:
    folder.mkdir()
    records = []
    for i, (a, b) in enumerate(
        [("Ann Lee", "Bo Ray"), ("Cy Dunn", "Di Fox"), ("Ed Gale", "Flo Hu")]
    ):
        records += [
            _record(i, "headline", "forward", a, b),
            _record(i, "headline", "reverse", b, a),
            _record(i, "qa", "forward", a, b),
        ]
    (folder / "test_prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def test_the_templates_forward_prompts_in_file_order_the_first_n(tmp_path):
    folder = dataset(tmp_path / "d")
    assert entity_prompts(folder) == [
        ("Ann Lee starred in a movie with", " Bo Ray", "Ann Lee"),
        ("Cy Dunn starred in a movie with", " Di Fox", "Cy Dunn"),
        ("Ed Gale starred in a movie with", " Flo Hu", "Ed Gale"),
    ]
    assert entity_prompts(folder, n=2) == entity_prompts(folder)[:2]
    assert entity_prompts(folder, n=10) == entity_prompts(folder)
    assert entity_prompts(folder, "qa", 1) == [
        ("Q: Who starred with Ann Lee? A:", " Bo Ray", "Ann Lee")
    ]
    assert entity_prompts(folder, directions=("reverse",))[0] == (
        "Bo Ray starred in a movie with",
        " Ann Lee",
        "Bo Ray",
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"template": "movie"},
            "no forward prompt of template 'movie'.*templates there: headline, qa",
        ),
        ({"n": 0}, "n=0: give a number of prompts of 1 or more"),
    ],
)
def test_bad_requests_are_one_error(tmp_path, kwargs, message):
    with pytest.raises(DatasetError, match=message):
        entity_prompts(dataset(tmp_path / "d"), **kwargs)


def test_a_prompt_without_a_first_entity_is_refused(tmp_path):
    folder = dataset(tmp_path / "d")
    lines = (folder / "test_prompts.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first["fields"] = {}
    (folder / "test_prompts.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    with pytest.raises(DatasetError, match="no first_actor span"):
        entity_prompts(folder)
    with pytest.raises(DatasetError, match="does not exist"):
        entity_prompts(tmp_path / "none")


def test_a_request_takes_several_templates_n_of_each_in_order(tmp_path):
    from graft.study import AttributionRequest
    from graft.study.designs.attribution import request_prompts

    folder = dataset(tmp_path / "d")
    request = AttributionRequest("donor", dataset=folder, template="qa, headline", n_prompts=2)
    texts, targets, entity = request_prompts(request)
    assert texts == [
        "Q: Who starred with Ann Lee? A:",
        "Q: Who starred with Cy Dunn? A:",
        "Ann Lee starred in a movie with",
        "Cy Dunn starred in a movie with",
    ]
    assert targets == [" Bo Ray", " Di Fox"] * 2 and entity == ["Ann Lee", "Cy Dunn"] * 2
