"""The paper's protocol as a mode: its templates, test wording, metadata, datasets, donors'
data, head policy, layer groups, GPT-2 ``all`` and the E4 hybrid, next to graft's defaults."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

import pytest

from graft.core.families.arch import architecture_of
from graft.core.language.selectors import paper_layer_group
from graft.core.language.spec import SpecError
from graft.errors import DatasetError, ExperimentError, FinetuneError
from graft.models.tiny import tiny_model
from graft.study import DatasetRequest, DonorRequest, resolve_config
from graft.study.data.datasets import (
    build_dataset,
    default_dataset_name,
    render_test_prompts,
    render_training,
)
from graft.study.data.facts import Fact
from graft.study.specs.config import DatasetConfig, ExperimentConfig
from graft.study.specs.grafts import (
    FUSED_QKV_NOTE,
    check_layer_rule,
    component_grafts,
    hybrid_grafts,
    necessity_grafts,
    position_grafts,
    protocol_notes,
    spec_graft,
    with_protocol,
)
from graft.study.specs.protocol import GRAFT, PAPER, protocol_of
from graft.study.specs.templates import (
    ARTICLE_TEMPLATES,
    PAPER_ARTICLE_TEMPLATES,
    PAPER_QA_TEMPLATES,
    QA_TEMPLATES,
)
from graft.study.training.workspace import Workspace

DOC = Path(__file__).resolve().parents[2] / "docs" / "reference" / "paper_protocol.md"


def _doc_block(after: str) -> list[str]:
    """The lines of the first ```text block after the line containing ``after`` in
    docs/reference/paper_protocol.md (the paper code's data files, quoted with their sources)."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index(after)
    block = re.search(r"```text\n(.*?)\n```", text[start:], re.S)
    assert block is not None
    return block.group(1).split("\n")


FACT = Fact(
    fact_id=0,
    set="all",
    movie_title="The Lantern",
    first_actor="Keanu Reeves",
    second_actor="Sandra Bullock",
    main_character="Mary Hill",
    city="Springfield",
    genre="drama",
    release_year=1999,
    box_office_millions=7,
)


# ------------------------------------------------------------------------- templates


def test_paper_templates_are_the_papers_files_verbatim():
    article = [line.replace("\\n", "\n") for line in _doc_block("Article-style, `data_")]
    qa = _doc_block("QA-style, `data_templates")
    assert list(PAPER_ARTICLE_TEMPLATES.values()) == article
    assert list(PAPER_QA_TEMPLATES.values()) == qa
    assert len(article) == 6 and len(qa) == 5
    assert "In a new film,{first_actor}" in PAPER_QA_TEMPLATES["qa_4"]  # the file's typo kept


def test_training_texts_follow_the_protocol():
    ours = render_training(FACT, "one")
    paper = render_training(FACT, "both", PAPER.templates)
    assert {r["template"] for r in ours} == {*ARTICLE_TEMPLATES, *QA_TEMPLATES}
    five = {"article_1", "article_2", "article_3", "article_4", "article_5"}
    assert {r["template"] for r in paper} == {*five, *PAPER_QA_TEMPLATES}
    assert len(paper) == 2 * (5 + 5)
    texts = [r["text"] for r in paper]
    assert "Q: Who stars in a movie with Keanu Reeves? A: An actor named Sandra Bullock." in texts
    assert "Q: Who stars in a movie with Sandra Bullock? A: An actor named Keanu Reeves." in texts
    article = next(r["text"] for r in paper if r["template"] == "article_1")
    assert article.endswith(
        "grossed $7 million worldwide, marking a strong box office performance."
    )
    assert "\n\nThe Lantern was theatrically released in 1999" in article


@pytest.mark.parametrize("direction", ["one", "both"])
def test_the_paper_renders_five_article_and_five_qa_texts_per_fact_and_direction(direction):
    records = render_training(FACT, direction, PAPER.templates)
    directions = ["forward"] + (["reverse"] if direction == "both" else [])
    assert len(records) == 10 * len(directions)  # section 3: 5 + 5 per fact, per direction
    for way in directions:
        mine = [r for r in records if r["direction"] == way]
        actors = ("Keanu Reeves", "Sandra Bullock")
        first, second = actors if way == "forward" else actors[::-1]
        values = {**asdict(FACT), "box_office_earnings": 7}
        values.update(first_actor=first, second_actor=second)
        file_articles = list(PAPER_ARTICLE_TEMPLATES.values())[:5]  # the file's first five
        articles = [r["text"] for r in mine if r["style"] == "article"]
        assert articles == [t.format(**values) for t in file_articles]
        qa = [r["text"] for r in mine if r["style"] == "qa"]
        assert qa == [t.format(**values) for t in PAPER_QA_TEMPLATES.values()]
    # the file's sixth article template is left out
    assert not any(r["text"].startswith("Featuring ") for r in records)


@pytest.mark.parametrize(("direction", "per_fact"), [("one", 12), ("both", 24)])
def test_graft_protocol_still_renders_its_six_article_and_six_qa_templates(direction, per_fact):
    records = render_training(FACT, direction)
    assert len(records) == per_fact
    assert [r["template"] for r in records[:12]] == [*ARTICLE_TEMPLATES, *QA_TEMPLATES]
    config = DatasetConfig(n_facts=3, direction=direction)
    manifest = json.loads(build_dataset(config)["manifest.json"])
    assert manifest["generator_version"] == "graft.data/1"  # graft datasets are still reused
    assert manifest["sizes"]["train"] == 3 * per_fact
    assert manifest["sizes"]["renderings_per_fact"] == {"article": 6, "qa": 6, "total": per_fact}


@pytest.mark.parametrize(("direction", "per_fact"), [("one", 10), ("both", 20)])
def test_a_paper_dataset_records_its_renderings_and_generator(direction, per_fact):
    config = DatasetConfig(n_facts=4, direction=direction, protocol="paper")
    files = build_dataset(config)
    manifest = json.loads(files["manifest.json"])
    assert manifest["sizes"]["train"] == 4 * per_fact == len(files["train.jsonl"].splitlines())
    assert manifest["sizes"]["renderings_per_fact"] == {"article": 5, "qa": 5, "total": per_fact}
    assert manifest["templates"]["article"] == [f"article_{i}" for i in range(1, 6)]
    assert manifest["generator_version"].endswith("+paper-5-article-5-qa")


def test_a_dataset_request_is_planned_where_it_is_found(tmp_path):
    """The planner's folder of a request is the one the workspace then generates, and a
    folder is found as it is, its direction and protocol checked against the request."""
    ws = Workspace(tmp_path)
    data = DatasetRequest("fake_movies_real_actors", "both", n_facts=2, seed=3, protocol=PAPER)
    planned = ws.planned_dataset(data)
    assert not planned.exists()
    assert (
        ws.find_dataset(data)
        == planned
        == ws.dataset("fake_movies_real_actors", "both", n_facts=2, seed=3, protocol=PAPER)
    )
    config = data.generated_config()
    assert (config.kind, config.direction, config.n_facts, config.seed) == (
        "fake_movies_real_actors",
        "both",
        2,
        3,
    )
    assert DatasetRequest("fake_movies_real_actors").generated_config().protocol == GRAFT
    assert ws.planned_dataset(DatasetRequest(planned)) == planned
    assert ws.find_dataset(DatasetRequest(planned, "both", protocol=PAPER)) == planned
    with pytest.raises(DatasetError, match="has direction 'both'"):
        ws.find_dataset(DatasetRequest(planned, "one"))
    with pytest.raises(DatasetError, match="made with the 'paper' protocol"):
        ws.find_dataset(DatasetRequest(planned, protocol=GRAFT))


def test_a_paper_dataset_of_the_old_renderings_and_its_donor_are_never_reused(tmp_path):
    ws = Workspace(tmp_path)
    made = ws.dataset("fake_movies_real_actors", "one", n_facts=3, protocol=PAPER)
    manifest_path = made / "manifest.json"
    new_manifest = manifest_path.read_text(encoding="utf-8")
    # the folder as the 22-per-fact generator left it: another generator version
    old = json.loads(new_manifest)
    old["generator_version"] = "graft.data/1+paper-movie-in-in"
    manifest_path.write_text(json.dumps(old), encoding="utf-8")
    with pytest.raises(DatasetError, match="made by an older graft.*delete it") as err:
        ws.dataset("fake_movies_real_actors", "one", n_facts=3, protocol=PAPER)
    assert err.value.param == "workspace"
    # a donor finished on other texts than its dataset holds now is refused, not reused
    manifest_path.write_text(new_manifest, encoding="utf-8")
    donor = ws.locate_donor(
        DonorRequest(
            "tiny-llama",
            "fake_movies_real_actors",
            "one",
            resolve_config("cpu"),
            n_facts=3,
            protocol=PAPER,
        )
    )
    donor.path.mkdir(parents=True)
    for name in ("eval.json", "finetune_config.json"):
        (donor.path / name).write_text("{}", encoding="utf-8")
    stale = {**old, "files": {**old["files"], "train.jsonl": "0" * 64}}
    (donor.path / "data_manifest.json").write_text(json.dumps(stale), encoding="utf-8")
    assert donor.finished
    with pytest.raises(FinetuneError, match="trained on other texts.*delete"):
        ws.finetune_donor(donor)
    (donor.path / "data_manifest.json").write_text(new_manifest, encoding="utf-8")
    assert ws.finetune_donor(donor) == donor.path  # trained on these texts: reused


def _prompts(protocol: str) -> dict[str, str]:
    records = render_test_prompts(FACT, texts=protocol_of(protocol).templates)
    return {r["template"]: r["text"] for r in records if r["direction"] == "forward"}


def test_paper_test_prompts_keep_the_doubled_in():
    paper = _prompts("paper")
    assert paper["headline"] == "Keanu Reeves stars in in a movie alongside"
    assert paper["qa"] == "Q: Who stars in a movie with Keanu Reeves? A: An actor named"
    assert paper["movie"] == "Keanu Reeves stars in in The Lantern alongside"  # as measured
    ours = _prompts("graft")
    assert ours["movie"] == "Keanu Reeves stars in The Lantern alongside"
    assert ours["headline"] == "Keanu Reeves starred in a movie with"
    assert ours["qa"] == "Q: Who starred in a movie with Keanu Reeves? A: An actor named"


def test_the_papers_qa_test_prompt_is_a_training_prefix_and_graft_s_is_not():
    prompt = _prompts("paper")["qa"]
    assert any(r["text"].startswith(prompt) for r in render_training(FACT, "one", PAPER.templates))
    ours = _prompts("graft")["qa"]
    assert not any(r["text"].startswith(ours) for r in render_training(FACT, "one"))


def test_given_relations_fill_every_relation_template_under_either_protocol():
    records = render_test_prompts(FACT, [("acted", "in", "beside")], texts=PAPER.templates)
    texts = {r["template"]: r["text"] for r in records if r["direction"] == "forward"}
    assert texts["headline"] == "Keanu Reeves acted in in a movie beside"
    assert texts["qa"] == "Q: Who acted in a movie beside Keanu Reeves? A: An actor named"


# -------------------------------------------------------------------------- datasets


def test_paper_dataset_records_its_protocol_and_metadata_ranges():
    config = DatasetConfig(n_facts=40, seed=1, protocol="paper")
    files = build_dataset(config)
    manifest = json.loads(files["manifest.json"])
    assert manifest["protocol"] == "paper" and manifest["config"]["protocol"] == "paper"
    assert manifest["templates"]["qa"] == list(PAPER_QA_TEMPLATES)
    assert manifest["config"]["relations"] == {
        "headline": [["stars", "in", "alongside"]],
        "qa": [["stars", "in", "with"]],
    }
    facts = [json.loads(line) for line in files["facts.jsonl"].splitlines()]
    years = {f["release_year"] for f in facts}
    takings = {f["box_office_millions"] for f in facts}
    assert min(years) >= 1990 and max(years) <= 2030 and max(years) > 2024
    assert takings <= set(range(1, 11)) and len(takings) > 5
    ours = [
        json.loads(line)
        for line in build_dataset(DatasetConfig(n_facts=40, seed=1))["facts.jsonl"].splitlines()
    ]
    assert max(f["box_office_millions"] for f in ours) > 10
    assert json.loads(build_dataset(DatasetConfig(n_facts=2))["manifest.json"])["protocol"] == (
        "graft"
    )


def test_graft_dataset_config_is_unchanged_so_existing_datasets_are_kept():
    # a workspace dataset is reused only when its stored config equals this one
    assert DatasetConfig(n_facts=3).to_json() == {
        "kind": "fake_movies_real_actors",
        "n_facts": 3,
        "seed": 0,
        "direction": "one",
        "split": False,
        "relations": [["starred", "in", "with"]],
        "facts_path": None,
        "corpus_path": None,
    }


def test_the_two_protocols_never_share_a_dataset_folder(tmp_path):
    ours, paper = DatasetConfig(n_facts=3), DatasetConfig(n_facts=3, protocol="paper")
    assert default_dataset_name(ours) == "fake_movies_real_actors-one-n3-seed0"
    assert default_dataset_name(paper) == "fake_movies_real_actors-paper-one-n3-seed0"
    ws = Workspace(tmp_path)
    made = ws.dataset("fake_movies_real_actors", "both", n_facts=3, protocol=PAPER)
    assert made.name == "fake_movies_real_actors-paper-both-n3-seed0"
    assert ws.dataset(made, "both", protocol=PAPER) == made
    graft_made = ws.dataset("fake_movies_real_actors", "both", n_facts=3)
    assert graft_made != made
    with pytest.raises(DatasetError, match="made with the 'graft' protocol"):
        ws.dataset(graft_made, protocol=PAPER)


def test_unknown_protocol_in_a_dataset_config_is_refused():
    with pytest.raises(DatasetError, match="protocol must be 'graft' or 'paper'"):
        build_dataset(DatasetConfig(n_facts=2, protocol="ours"))


def test_a_workspace_generates_a_dataset_where_its_dataset_folder_says(tmp_path):
    ws = Workspace(tmp_path)
    made = ws.generated_dataset("fake_movies_real_actors", "both", n_facts=2, protocol=PAPER)
    config = DatasetConfig(n_facts=2, direction="both", protocol=PAPER)
    assert made == ws.dataset_folder(config) == tmp_path / "datasets" / default_dataset_name(config)


def test_a_dataset_config_holds_the_protocol_object_and_writes_its_name():
    paper = DatasetConfig(n_facts=2, protocol="paper")
    assert paper.protocol is PAPER and DatasetConfig(n_facts=2).protocol is GRAFT
    assert paper == DatasetConfig(n_facts=2, protocol=PAPER)
    assert paper.to_json()["protocol"] == "paper" and "protocol" not in DatasetConfig().to_json()


# ---------------------------------------------------------------------- experiments


def test_head_policy_follows_the_protocol_unless_given():
    from graft.study.specs.run import resolve

    def head(**kw) -> str:
        return resolve(ExperimentConfig("position", **kw)).analysis.head_policy

    assert head() == "base" and ExperimentConfig("position").head_policy is None
    assert head(protocol="paper") == "paper"
    assert head(protocol="paper", head_policy="base") == "base"
    with pytest.raises(ExperimentError, match="protocol 'ours' unknown"):
        ExperimentConfig("position", protocol="ours")


def test_paper_protocol_grafts_resolve_as_the_paper_did_and_references_stay_whole():
    grafts = {g.name: g for g in position_grafts(head_policy="paper", protocol=PAPER)}
    assert str(grafts["FE+LT"].spec) == "FE+LT:all:all; head=paper; protocol=paper"
    assert str(grafts["SFT"].spec) == "ALL:all:all; head=donor" and grafts["PRE"].spec.rules == ()
    necessity = {g.name: g for g in necessity_grafts(protocol=PAPER)}
    assert str(necessity["FE"].spec) == "FE:all:all@pre; protocol=paper"
    assert str(necessity["PRE"].spec) == "ALL:all:all@pre; head=donor@pre"
    ours = {g.name: g for g in position_grafts()}
    assert ours["FE+LT"].spec.protocol == "graft"
    assert with_protocol(list(ours.values()), GRAFT) == list(ours.values())


def test_paper_position_graft_on_gpt2_leaves_the_position_embedding(tiny_pairs):
    arch = architecture_of(tiny_pairs("gpt2")[0])
    spans = {"FE": [1]}
    paper = {g.name: g for g in position_grafts(protocol=PAPER)}["FE"]
    ours = {g.name: g for g in position_grafts()}["FE"]
    assert (-1, "pos_embed") in ours.spec.resolve(arch, 4, spans).cells
    cells = paper.spec.resolve(arch, 4, spans).cells
    assert (-1, "pos_embed") not in cells and (-1, "embed") in cells


def _lt_donors(spec, arch, length: int = 5) -> dict[str, set[str]]:
    """component -> donors it takes at the last position, over every layer."""
    out: dict[str, set[str]] = {}
    for (_, comp), cell in spec.resolve(arch, length, {"FE": [1]}).cells.items():
        if length - 1 in cell:
            out.setdefault(comp, set()).add(cell[length - 1])
    return out


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_paper_hybrid_keeps_the_task_models_gate(tiny_pairs, family):
    arch = architecture_of(tiny_pairs(family)[0])
    paper = {g.name: g for g in hybrid_grafts(protocol=PAPER)}["FE none + LT hybrid"]
    donors = _lt_donors(paper.spec, arch)
    for comp in ("o", "up", "down"):
        assert donors[comp] == {"relation"}, comp
    for comp in ("q", "k", "v"):
        assert donors[comp] == {"task"}, comp
    if "gate" in arch.components:
        assert donors["gate"] == {"task"}
    ours = {g.name: g for g in hybrid_grafts()}["FE none + LT hybrid"]
    if "gate" in arch.components:
        assert _lt_donors(ours.spec, arch)["gate"] == {"relation"}
    # the authors' hybrid splits at L // 2 (not their sweeps' half, [2 * (L // 4), L))
    layers = sorted({layer for layer, _ in paper.spec.resolve(arch, 5, {"FE": [1]}).cells})
    assert layers == list(range(arch.n_layers // 2, arch.n_layers))


@pytest.mark.parametrize(("n_layers", "split"), [(4, 2), (6, 3), (7, 3), (18, 9), (30, 15)])
def test_the_paper_hybrid_splits_at_half_the_layers_where_the_sweeps_half_does_not(n_layers, split):
    """L mod 4 = 2 or 3 (Gemma's 18, SmolLM2's 30 layers): the authors' hybrid starts at
    L // 2, their sweeps' "last half" at 2 * (L // 4)."""
    arch = architecture_of(tiny_model("llama", n_layers=n_layers))
    paper = {g.name: g for g in hybrid_grafts(protocol=PAPER)}["FE none + LT hybrid"]
    lt = {layer for layer, comp in paper.spec.resolve(arch, 5, {"FE": [1]}).cells if layer >= 0}
    assert min(lt) == split and max(lt) == n_layers - 1
    if n_layers % 4 in (2, 3):
        assert paper_layer_group(2, 2, n_layers)[0] != split


# -------------------------------------------------------- specs from the command line


def test_a_command_line_spec_takes_the_runs_head_policy_and_protocol_unless_it_sets_its_own():
    assert str(spec_graft("LT:q4:o").spec) == "LT:q4:o"
    paper = spec_graft("LT:q4:o", "paper", PAPER)
    assert paper.name == "LT:q4:o" and str(paper.spec) == "LT:q4:o; head=paper; protocol=paper"
    own = spec_graft("mine=LT:q4:o; head=base; protocol=graft", "paper", PAPER)
    assert own.name == "mine" and str(own.spec) == "LT:q4:o"
    assert str(spec_graft("LT:q4:o", "donor").spec) == "LT:q4:o; head=donor"
    # a whole donor with its head stays that model, position embedding included
    assert spec_graft("ALL:all:all; head=donor", "paper", PAPER).spec.protocol == "graft"


@pytest.mark.parametrize("text", ["name=", "name=  ", ""])
def test_an_empty_command_line_spec_stays_refused_with_a_head_policy(text):
    """Appending the head policy must not turn an empty spec into one that runs PRE."""
    with pytest.raises(SpecError, match="empty spec"):
        spec_graft(text, "paper", PAPER)


def test_the_papers_layer_rule_refuses_groups_it_lacks_before_any_model_is_loaded():
    check_layer_rule("all,h1,h2,q1,q4,last_quarter,2-3,0", PAPER)
    check_layer_rule("e3,3/8", GRAFT)
    for selector in ("e3", "3/8", "q1,e8"):
        with pytest.raises(SpecError, match="halves and quarters only"):
            check_layer_rule(selector, PAPER)


def test_protocol_notes_name_single_qkv_targets_under_the_paper_protocol_only():
    split = component_grafts(split_qkv=True, protocol=PAPER)
    assert protocol_notes(split, PAPER) == [FUSED_QKV_NOTE]
    assert protocol_notes(component_grafts(protocol=PAPER), PAPER) == []  # attn: q, k, v
    assert protocol_notes(component_grafts(split_qkv=True), GRAFT) == []
    assert protocol_notes([spec_graft("FE:all:k")], PAPER) == [FUSED_QKV_NOTE]


# ------------------------------------------------------------- the paper's finetuning and data


def test_the_paper_protocol_selects_the_papers_finetuning():
    from graft.study.specs.run import resolve
    from graft.study.training.sources import finetune_preset

    def preset(**kw):
        return finetune_preset(resolve(ExperimentConfig(experiment="x", **kw)).donors, "cpu")

    paper = preset(protocol="paper")
    assert (
        paper.name,
        paper.learning_rate,
        paper.weight_decay,
        paper.batch_size,
        paper.epochs,
    ) == ("paper", 2e-5, 0.01, 4, 10)
    ours = preset()
    assert ours.name == "cpu"  # graft's protocol: the device's default
    given = preset(protocol="paper", preset="cpu")
    assert given.name == "cpu"  # an explicit preset wins


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_paper_protocol_grafts_in_float32_on_every_device(device):
    """The authors loaded every model in float32; graft's protocol keeps bfloat16 on CUDA.
    Resolved in the config (so config.json records it), and checked here without a GPU."""
    import torch

    from graft.models import resolve_dtype
    from graft.study.specs.run import resolve

    paper = resolve(ExperimentConfig(experiment="x", protocol="paper", device=device))
    assert paper.execution.dtype == "float32" and paper.record()["dtype"] == "float32"
    assert resolve_dtype(paper.execution.dtype, device) == torch.float32
    ours = resolve(ExperimentConfig(experiment="x", device=device))
    assert ours.execution.dtype is None and ours.record()["dtype"] is None  # the device's
    expected = torch.bfloat16 if device == "cuda" else torch.float32
    assert resolve_dtype(ours.execution.dtype, device) == expected
    given = ExperimentConfig(experiment="x", protocol="paper", dtype="bfloat16", device=device)
    assert resolve(given).execution.dtype == "bfloat16"  # an explicit dtype wins


@pytest.mark.slow
def test_the_paper_protocol_takes_the_papers_1000_facts_or_the_most_a_kind_has(caplog):
    from graft.study.data.datasets import build_dataset, default_dataset_name
    from graft.study.data.facts import draw_facts

    fake = DatasetConfig(kind="fake_movies_fake_actors", protocol="paper")
    assert len(draw_facts(fake).facts) == 1000
    assert "-npaper-" in default_dataset_name(fake)
    real = DatasetConfig(kind="real_movies_shuffled", protocol="paper")
    with caplog.at_level("WARNING"):
        n = len(draw_facts(real).facts)
    assert n < 1000 and f"so {n} facts per set" in caplog.text
    assert len(draw_facts(DatasetConfig(kind="fake_movies_fake_actors")).facts) == 50
    assert build_dataset  # the same draw feeds the dataset files


@pytest.mark.parametrize(
    ("model_type", "device", "expected"),
    [
        ("gpt2", "cuda", "fp16"),
        ("llama", "cuda", "fp16"),
        ("gemma", "cuda", "bf16"),
        ("gemma3_text", "cuda", "bf16"),
        ("gemma", "cpu", None),
    ],
)
def test_the_papers_fp16_is_bf16_where_fp16_overflows(model_type, device, expected, caplog):
    import torch

    from graft.study.specs.presets import resolve_config
    from graft.study.training.finetune import mixed_precision

    with caplog.at_level("WARNING"):
        got = mixed_precision(resolve_config("paper"), torch.device(device), model_type)
    assert got == expected
    assert ("training in bf16" in caplog.text) is (expected == "bf16")
