"""The ``graft-exp`` experiment commands end to end on a tiny model, through click's CliRunner.

Every command runs on ``tiny-llama`` (character-level tokenizer, so accuracies are ~0: only
the plumbing is checked here, and the numbers against the engine). One workspace is shared
by the whole module, so each tiny donor (``one``, ``both``, ``task``, ``relation``) is
finetuned once, for 2 steps. Runs are module-scoped fixtures that several tests inspect.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import polars as pl
import pytest
import torch
from click.testing import CliRunner, Result

import graft.study.running.batches
from graft.core.execution.engine import GraftRow, run_grafts
from graft.core.language.spec import parse_spec
from graft.models import load_model
from graft.study.data.prompts import load_test_prompts
from graft_experiments.cli import COMMANDS, main
from tests.cli.tiny_runs import tiny_args
from tests.engine_cases import BASE_POSITIONS

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

MODEL = "tiny-llama"
TEMPLATES = ("headline", "movie", "qa")
POSITION_GRAFTS = {
    "headline": ["PRE", "SFT", *BASE_POSITIONS, "R", "FE+R", "R+LT"],
    "qa": ["PRE", "SFT", *BASE_POSITIONS, "R", "FE+R", "R+LT"],
    "movie": ["PRE", "SFT", *BASE_POSITIONS, "M", "FE+M", "M+LT"],
}
COMPONENT_GRAFTS = [
    "PRE",
    "SFT",
    "ATTN+O+FFN",
    "ATTN+O",
    "O+FFN",
    "ATTN+FFN",
    "O",
    "FFN",
    "O+FFN_up",
    "O+FFN_down",
]
RUN_FILES = ("config.json", "summary.parquet", "summary.csv", "examples.parquet", "drops.json")
# The engine's float32 bound on logits is 1e-5; a log-softmax moves by at most twice the
# largest logit change, so log-probs (and probabilities <= 1) of two runs agree to 2e-5.
LOGPROB_TOL = 2e-5


def stored_graft_rows(rows: pl.DataFrame, by_id: dict) -> list[GraftRow]:
    """The engine rows of a run's stored ``rows``, each checked against its test prompt in
    ``by_id`` (prompt id -> example): the same target and text."""
    graft_rows = []
    for row in rows.iter_rows(named=True):
        ex = by_id[row["prompt_id"]]
        assert row["target_id"] == ex.target_id and row["text"] == ex.text
        graft_rows.append(GraftRow(ex.input_ids, ex.spans, parse_spec(row["spec"])))
    return graft_rows


@pytest.fixture(scope="module")
def common(workspace) -> list[str]:
    """Options of every run: tiny model, small data, 2-step finetunes, 2 prompts/template."""
    return tiny_args(workspace, model=MODEL)


def invoke(*args: str, code: int = 0) -> Result:
    """Run ``graft-exp ARGS`` in-process; fail with the output if the exit code differs."""
    result = CliRunner().invoke(main, list(args))
    if result.exit_code != code:
        import traceback

        tb = "".join(traceback.format_exception(*result.exc_info)) if result.exc_info else ""
        pytest.fail(
            f"graft-exp {' '.join(args)}: exit {result.exit_code}, expected {code}\n"
            f"{result.output}\n{tb}"
        )
    return result


def check_run_folder(folder: Path, files=RUN_FILES) -> None:
    for name in files:
        assert (folder / name).is_file(), f"{folder / name} missing"
        assert (folder / name).stat().st_size > 0
    assert not list(folder.rglob("*.tmp")), "stray temp files left behind"


def check_figures(folder: Path, stems: list[str], metric: str = "acc5") -> None:
    fig_dir = folder / "figures"
    for stem in stems:
        for ext in (".png", ".pdf"):
            path = fig_dir / f"{stem}_{metric}{ext}"
            assert path.is_file(), (
                f"{path} missing; have {sorted(p.name for p in fig_dir.iterdir())}"
            )
            assert path.stat().st_size > 1000
    assert (fig_dir / f"{stems[0]}_{metric}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (fig_dir / f"{stems[0]}_{metric}.pdf").read_bytes()[:5] == b"%PDF-"


def grafts_by_template(summary: pl.DataFrame, group: str = "") -> dict[str, list[str]]:
    part = summary.filter(pl.col("group") == group)
    return {t: part.filter(pl.col("template") == t)["graft"].to_list() for t in TEMPLATES}


def read_examples(folder: Path) -> pl.DataFrame:
    return pl.read_parquet(folder / "examples.parquet").sort(["prompt_id", "graft"])


def assert_untouched(out: Path) -> None:
    """A failed start leaves nothing behind in the run folder."""
    assert not out.exists() or not any(out.iterdir()), sorted(p.name for p in out.rglob("*"))


# --------------------------------------------------------------------------- runs (fixtures)


@pytest.fixture(scope="module")
def position_run(tmp_path_factory, common) -> tuple[Path, Result]:
    out = tmp_path_factory.mktemp("runs") / "position"
    # 6 prompts x 11 grafts = 66 rows in batches of 32: the resume test has 3 batches
    result = invoke("position", *common, "--rows-per-forward", "32", "--out", str(out))
    return out, result


@pytest.fixture(scope="module")
def component_run(tmp_path_factory, common) -> Path:
    out = tmp_path_factory.mktemp("runs") / "component"
    invoke("component", *common, "--templates", "headline,qa", "--out", str(out))
    return out


@pytest.fixture(scope="module")
def layers_run(tmp_path_factory, common) -> Path:
    out = tmp_path_factory.mktemp("runs") / "layers"
    invoke(
        "layers",
        *common,
        "--templates",
        "headline",
        "--positions",
        "FE,LT",
        "--windows",
        "2",
        "--components",
        "block;o,ffn",
        "--out",
        str(out),
    )
    return out


# ------------------------------------------------------------------------------- help


HELP = {
    "position": ["--positions", "--variant", "--model", "--dataset", "--out", "--overwrite"],
    "necessity": ["--positions", "--variant", "PRE"],
    "component": ["--layers", "--pairs", "--split-qkv", "--fe", "reversal"],
    "hybrid": ["--lt-layers", "task", "relation"],
    "layers": ["--positions", "--windows", "--components", "eighths"],
    "tokens": ["--spec", "--per-graft", "top-10"],
    "lens": ["--spec", "--variant", "FE-last", "lens_summary.csv"],
    "patching": [
        "--positions",
        "--kinds",
        "--modes",
        "--window",
        "--methods",
        "--whole-depth",
        "--variant",
    ],
    "custom": ["--spec", "--donor", "--base", "--directions", "--references"],
    "attribution": ["--base-model", "--donor-model", "--text", "--target", "--verify"],
    "plot": ["RUN_FOLDER", "--metric", "--figures-dir"],
    "compare": ["RUN_FOLDER", "GRAFT_A", "GRAFT_B", "--metric", "--score", "McNemar"],
    "data": ["--dataset", "--n-facts", "--split"],
    "finetune": ["--model", "--preset", "--variant"],
    "smoke": ["--family"],
    "publish": ["RUN_FOLDER", "--to", "--as", "--allow-incomplete", "provenance.json"],
    "accept": ["FOLDER", "checksums.json", "config.json", "--quiet"],
    "repair": ["RUN_FOLDER", "config.json", "--overwrite"],
    "study": ["plan", "run", "status", "collect", "TOML", "docs/how-to/study.md"],
}


def test_group_help_lists_every_command():
    result = invoke("--help")
    for _, name in COMMANDS:
        assert name in result.output
    assert set(HELP) == {name for _, name in COMMANDS}


@pytest.mark.parametrize("command", sorted(HELP))
def test_command_help(command):
    result = invoke(command, "--help")
    text = " ".join(result.output.split())  # undo click's line wrapping
    assert text.startswith(f"Usage: main {command}")
    for needle in HELP[command]:
        assert needle in text, f"{command} --help does not mention {needle}"
    if command not in (
        "plot",
        "compare",
        "data",
        "finetune",
        "smoke",
        "publish",
        "accept",
        "repair",
        "study",
        "attribution",  # takes two models and texts: no workspace, bootstrap or templates
    ):
        for shared in ("--workspace", "--n-boot", "--templates", "--quiet"):
            assert shared in text


# ------------------------------------------------------------------------------ commands


def test_position(position_run):
    out, result = position_run
    check_run_folder(out)
    check_figures(out, [f"position_{t}" for t in TEMPLATES])
    summary = pl.read_parquet(out / "summary.parquet")
    # M variants only on the movie template, R variants only on headline and qa; in order
    assert grafts_by_template(summary) == POSITION_GRAFTS
    assert (summary["n"] == 2).all()
    examples = read_examples(out)
    assert examples.height == sum(2 * len(g) for g in POSITION_GRAFTS.values())
    assert examples.select(["prompt_id", "graft"]).is_duplicated().sum() == 0
    assert set(examples["direction"]) == {"forward"}
    csv = pl.read_csv(out / "summary.csv")
    assert csv.height == summary.height
    config = json.loads((out / "config.json").read_text())
    assert config["experiment"] == "position"
    assert config["options"]["n"] == 2 and config["options"]["model"] == MODEL
    assert [g["name"] for g in config["grafts"]][:2] == ["PRE", "SFT"]
    assert Path(config["donors"]["sft"]["path"]).is_dir()
    drops = json.loads((out / "drops.json").read_text())
    assert drops["skipped_grafts"] == {"M": 4, "FE+M": 4, "M+LT": 4, "R": 2, "FE+R": 2, "R+LT": 2}
    assert "(0 already done)" in result.output
    assert f"results: {out}" in result.output
    times = re.search(r"^time: data and checks .*, grafting .*\(total .*\)$", result.output, re.M)
    assert times, result.output
    assert re.search(r"^time: figures [0-9.]+ s$", result.output, re.M)


def test_position_writes_the_top1_kinds(position_run):
    """top1_kinds: every (template, graft) of the summary, all kinds, counts summing to n,
    the top-1 token of each row from examples.parquet; printed, and stored as parquet + CSV."""
    from graft.results.top1_kinds import KINDS, Top1Classifier
    from graft.storage.tables import read_table
    from graft.study.data.datasets import load_facts

    out, result = position_run
    table = read_table(out / "top1_kinds.parquet", "top1_kinds")  # metadata and digest
    assert pl.read_csv(out / "top1_kinds.csv").height == table.height
    assert "top-1 token kinds" in result.output and "punct_function" in result.output
    summary = pl.read_parquet(out / "summary.parquet").filter(pl.col("group") == "")
    groups = table.group_by("template", "graft", maintain_order=True).agg(
        pl.col("kind"), pl.col("count").sum(), pl.col("n").first()
    )
    assert groups.height == summary.height
    assert all(kinds == list(KINDS) for kinds in groups["kind"].to_list())
    assert (groups["count"] == groups["n"]).all()
    assert set(groups["n"]) == {2}
    facts = load_facts(json.loads((out / "config.json").read_text())["dataset"]["path"])
    kind = Top1Classifier(
        [f.first_actor for f in facts] + [f.second_actor for f in facts],
        [f.movie_title for f in facts],
    ).kind
    rows = read_examples(out).filter(template="movie", graft="SFT")
    want = {k: [kind(t[0]) for t in rows["top10_tokens"]].count(k) for k in KINDS}
    got = table.filter(template="movie", graft="SFT")
    assert dict(zip(got["kind"], got["count"], strict=True)) == want


def test_necessity(tmp_path, common):
    out = tmp_path / "necessity"
    invoke(
        "necessity", *common, "--templates", "movie", "--positions", "FE,LT,M", "--out", str(out)
    )
    check_run_folder(out)
    check_figures(out, ["necessity_movie"])
    summary = pl.read_parquet(out / "summary.parquet")
    assert summary["graft"].to_list() == ["SFT", "PRE", "FE", "LT", "M"]
    config = json.loads((out / "config.json").read_text())
    assert config["base"]["path"] != MODEL  # the finetuned model is the base
    assert config["donors"]["pre"]["path"] == MODEL
    specs = dict(zip(*read_examples(out).select(["graft", "spec"]).unique(), strict=True))
    assert specs["FE"] == "FE:all:all@pre"


def test_component_both_pairs(component_run):
    out = component_run
    # the combined folder: summary, config and figures of both pairs
    check_run_folder(out, ("config.json", "summary.parquet", "summary.csv"))
    check_figures(out, ["component_headline", "component_qa"])
    summary = pl.read_parquet(out / "summary.parquet")
    assert summary["group"].unique(maintain_order=True).to_list() == ["sft", "reversal"]
    for pair in ("sft", "reversal"):
        for template in ("headline", "qa"):
            got = summary.filter((pl.col("group") == pair) & (pl.col("template") == template))
            assert got["graft"].to_list() == COMPONENT_GRAFTS
        check_run_folder(out / pair)
        check_figures(out / pair, ["component_headline", "component_qa"])
    assert json.loads((out / "config.json").read_text())["pairs"] == ["sft", "reversal"]
    sft_cfg = json.loads((out / "sft" / "config.json").read_text())
    rev_cfg = json.loads((out / "reversal" / "config.json").read_text())
    # reversal: the both-directions model grafted into the one-direction model (= SFT's donor)
    assert rev_cfg["base"]["path"] == sft_cfg["donors"]["sft"]["path"]
    assert rev_cfg["donors"]["sft"]["path"] != sft_cfg["donors"]["sft"]["path"]
    assert set(read_examples(out / "sft")["direction"]) == {"forward"}
    assert set(read_examples(out / "reversal")["direction"]) == {"reverse"}
    specs = dict(zip(*read_examples(out / "sft").select(["graft", "spec"]).unique(), strict=True))
    assert specs["O+FFN"] == "LT:q4:o,ffn"


def test_hybrid(tmp_path, common):
    out = tmp_path / "hybrid"
    invoke("hybrid", *common, "--templates", "headline", "--out", str(out))
    check_run_folder(out)
    check_figures(out, ["hybrid_headline"])
    summary = pl.read_parquet(out / "summary.parquet")
    fe = ["none", "all", "ATTN", "FFN", "O+FFN", "ATTN+O"]
    expected = ["PRE", "TASK", "RELATION"] + [f"FE {v} + LT hybrid" for v in fe]
    assert summary["graft"].to_list() == expected
    config = json.loads((out / "config.json").read_text())
    task, relation = config["donors"]["task"]["path"], config["donors"]["relation"]["path"]
    assert task != relation
    # tested on fact set B, the relation model's facts
    data = Path(config["dataset"]["path"])
    facts = [json.loads(line) for line in (data / "facts.jsonl").read_text().splitlines()]
    set_of = {f["fact_id"]: f["set"] for f in facts}
    assert {set_of[i] for i in read_examples(out)["fact_id"]} == {"B"}
    specs = dict(zip(*read_examples(out).select(["graft", "spec"]).unique(), strict=True))
    assert specs["FE ATTN + LT hybrid"] == "FE:all:qkv@task; LT:h2:qkv@task; LT:h2:o,ffn@relation"
    # the paper's Fig. 5 comparisons, paired per prompt (the paper table reads them)
    contrasts = pl.read_csv(out / "contrasts.csv")
    assert contrasts.select("graft_a", "graft_b").rows() == [
        ("FE ATTN + LT hybrid", "FE none + LT hybrid"),
        ("FE FFN + LT hybrid", "FE none + LT hybrid"),
    ]


def test_layers(layers_run):
    out = layers_run
    check_run_folder(out)
    check_figures(out, ["layers_block_headline", "layers_o-ffn_headline"])
    summary = pl.read_parquet(out / "summary.parquet")
    # tiny-llama has 4 layers: windows of 2 are 0-1 and 2-3
    cells = [f"{p} | {w}" for p in ("FE", "LT") for w in ("0-1", "2-3")]
    assert grafts_by_template(summary, "block")["headline"] == cells
    assert grafts_by_template(summary, "o,ffn")["headline"] == cells
    assert grafts_by_template(summary, "")["headline"] == ["PRE", "SFT"]
    specs = set(read_examples(out)["spec"])
    assert {"FE:0-1:block", "LT:2-3:o,ffn"} <= specs


def test_layers_rows_run_from_their_windows_first_layer_as_whole_forwards(
    tmp_path, common, monkeypatch
):
    """E7's rows start at their window's first layer (the layers below once per prompt): the
    same rows as every row's whole forward (--no-reuse), to rounding; config.json says which.
    ALL's rows resume; FE's (after tiny-llama's start token) take the shared-prefix step."""
    from graft.core.execution import resume

    seen: list = []
    original = resume.prepare
    monkeypatch.setattr(resume, "prepare", lambda *a, **k: seen.append(r := original(*a, **k)) or r)
    args = ["--templates", "headline", "--positions", "ALL,FE", "--windows", "1"]
    runs = {flag: tmp_path / flag.strip("-") for flag in ("--reuse", "--no-reuse")}
    invoke("layers", *common, *args, "--no-reuse", "--out", str(runs["--no-reuse"]))
    assert not seen, "--no-reuse ran rows from their first layer"
    invoke("layers", *common, *args, "--out", str(runs["--reuse"]))
    assert any(r is not None for r in seen), f"no batch ran from its rows' first layers: {seen}"
    resumed, whole = (read_examples(out) for out in runs.values())
    assert resumed["spec"].to_list() == whole["spec"].to_list()
    assert resumed["target_rank"].to_list() == whole["target_rank"].to_list()
    diff = (resumed["target_logprob"] - whole["target_logprob"]).abs().max()
    assert diff <= 1e-5, diff
    for flag, out in runs.items():
        assert json.loads((out / "config.json").read_text())["layer_reuse"] is (flag == "--reuse")


def test_layers_named_windows(tmp_path, common):
    out = tmp_path / "layers"
    invoke(
        "layers",
        *common,
        "--templates",
        "qa",
        "--n",
        "1",
        "--positions",
        "LT",
        "--windows",
        "quarters",
        "--out",
        str(out),
    )
    summary = pl.read_parquet(out / "summary.parquet")
    assert summary.filter(pl.col("group") == "block")["graft"].to_list() == [
        f"LT | q{k}" for k in range(1, 5)
    ]
    check_figures(out, ["layers_block_qa"])


def test_tokens(tmp_path, common):
    out = tmp_path / "tokens"
    result = invoke(
        "tokens", *common, "--templates", "headline,movie", "--per-graft", "1", "--out", str(out)
    )
    check_run_folder(out)
    for name in ("top_tokens.parquet", "top_tokens.csv"):
        assert (out / name).stat().st_size > 0
    table = pl.read_parquet(out / "top_tokens.parquet")
    grafts = ["PRE", "SFT", "FE", "LT", "FE+LT"]
    assert set(table["graft"]) == set(grafts)
    for (template, name), part in table.group_by(["template", "graft"]):
        assert part["example"].n_unique() == 1, (template, name)  # --per-graft 1
        assert sorted(part["rank"].to_list()) == list(range(10))
        probs = part.sort("rank")["prob"].to_list()
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-5
    assert table["is_target"].dtype == pl.Boolean
    assert pl.read_csv(out / "top_tokens.csv").height == table.height
    assert "top tokens:" in result.output


def test_custom(tmp_path, common):
    out = tmp_path / "custom"
    invoke(
        "custom",
        *common,
        "--templates",
        "movie,qa",
        "--spec",
        "LT:h2:o,ffn",
        "--spec",
        "mine=FE:all:attn",
        "--spec",
        "M:all:all",
        "--out",
        str(out),
    )
    check_run_folder(out)
    check_figures(out, ["custom_movie", "custom_qa"])
    by_template = grafts_by_template(pl.read_parquet(out / "summary.parquet"))
    assert by_template["movie"] == ["PRE", "SFT", "LT:h2:o,ffn", "mine", "M:all:all"]
    assert by_template["qa"] == ["PRE", "SFT", "LT:h2:o,ffn", "mine"]  # qa has no movie title
    specs = dict(zip(*read_examples(out).select(["graft", "spec"]).unique(), strict=True))
    assert specs["mine"] == "FE:all:attn"


def test_custom_donors_and_no_references(tmp_path, common):
    out = tmp_path / "custom2"
    invoke(
        "custom",
        *common,
        "--templates",
        "headline",
        "--n",
        "1",
        "--donor",
        "both=both",
        "--donor",
        "sft=one",
        "--no-references",
        "--spec",
        "x=LT:all:all@both",
        "--spec",
        "y=FE:all:all@sft; LT:all:o@both",
        "--out",
        str(out),
    )
    config = json.loads((out / "config.json").read_text())
    assert set(config["donors"]) == {"both", "sft"}
    assert pl.read_parquet(out / "summary.parquet")["graft"].to_list() == ["x", "y"]


def test_plot_redraws_from_run_folders(position_run, layers_run, component_run):
    out, _ = position_run
    saved = pl.read_parquet(out / "summary.parquet")
    shutil.rmtree(out / "figures")
    result = invoke("plot", str(out), "--metric", "mean_rank")
    check_figures(out, [f"position_{t}" for t in TEMPLATES], metric="mean_rank")
    assert result.output.count("figure: ") == 3
    assert pl.read_parquet(out / "summary.parquet").equals(saved)  # nothing recomputed
    for folder, stem in ((layers_run, "layers_block_headline"), (component_run, "component_qa")):
        (folder / "figures" / f"{stem}_acc5.png").unlink()
        invoke("plot", str(folder))
        check_figures(folder, [stem])


def test_plot_rejects_unfinished_folder(tmp_path):
    result = invoke("plot", str(tmp_path), code=2)
    assert "not a finished run folder" in result.output


# ------------------------------------------------------------------------ resume / config


@pytest.fixture
def engine_calls(monkeypatch) -> list[int]:
    """The rows of each engine call the runner makes (``graft.study.running.batches._row_metrics``)."""
    calls: list[int] = []
    original = graft.study.running.batches._row_metrics

    def counting(cfg, base, donors, rows, *args):
        calls.append(len(rows))
        return original(cfg, base, donors, rows, *args)

    monkeypatch.setattr(graft.study.running.batches, "_row_metrics", counting)
    return calls


def position_args(common, out: Path, *extra: str) -> list[str]:
    return ["position", *common, "--rows-per-forward", "32", "--out", str(out), *extra]


def interrupt(full: Path, out: Path, lost: tuple[int, ...]) -> Path:
    """``out``: a copy of the finished run ``full`` as an interruption leaves it: the batches
    ``lost`` never written (the first of them in flight, as a temp file), no tables."""
    shutil.copytree(full, out)
    parts = out / "parts" / "examples"
    assert sorted(p.name for p in parts.iterdir()) == ["0.parquet", "1.parquet", "2.parquet"]
    (parts / f"{lost[0]}.parquet").rename(parts / f".{lost[0]}.parquet.123.abcd.tmp")
    for batch in lost[1:]:
        (parts / f"{batch}.parquet").unlink()
    (out / "examples.parquet").unlink()
    (out / "summary.parquet").unlink()
    return out


def test_resume_after_interruption(position_run, tmp_path, common, engine_calls):
    full, _ = position_run
    expected = read_examples(full)
    out = interrupt(full, tmp_path / "interrupted", lost=(1, 2))

    result = invoke(*position_args(common, out))
    assert "3 batches (1 already done)" in result.output
    assert engine_calls == [66]  # the run's one group of batches, as the whole run had it
    got = read_examples(out)
    assert got.select(["prompt_id", "graft"]).is_duplicated().sum() == 0
    assert got.equals(expected)
    assert pl.read_parquet(out / "summary.parquet").equals(
        pl.read_parquet(full / "summary.parquet")
    )
    assert not list(out.rglob("*.tmp"))
    config = json.loads((out / "config.json").read_text())
    assert len(config["resumes"]) == 1

    # a rerun of a finished run recomputes nothing and changes nothing
    engine_calls.clear()
    result = invoke(*position_args(common, out))
    assert "3 batches (3 already done)" in result.output
    assert engine_calls == []
    assert read_examples(out).equals(expected)
    assert len(json.loads((out / "config.json").read_text())["resumes"]) == 2


@pytest.mark.parametrize("path", ["shortcuts", "fallback"])
def test_resume_is_bit_identical_on_every_engine_path(
    path, tmp_path, common, engine_calls, monkeypatch
):
    """Interrupted inside a group of batches, a run resumed gives exactly the rows of a whole
    run, on the shortcut path and on the path without the shared prefix (where a row's floats
    depend on the rows batched with it: before groups were fixed by the plan, the resumed
    batches ran in other company there and came out different)."""
    import graft.core.execution.routing as routing

    monkeypatch.setattr(graft.study.running.batches, "GROUP_BATCHES", 2)  # groups: batches 0-1, 2
    if path == "fallback":
        monkeypatch.setattr(routing, "accepts_cache", lambda model: False)
        monkeypatch.setattr(routing, "_warned", set())
    full = tmp_path / "full"
    invoke(*position_args(common, full))
    config = json.loads((full / "config.json").read_text())["engine"]
    assert config["shared_prefix"] is (path == "shortcuts") and config["group_batches"] == 2
    assert bool(config["fallbacks"]) is (path == "fallback")
    engine_calls.clear()

    out = interrupt(full, tmp_path / "interrupted", lost=(1, 2))
    result = invoke(*position_args(common, out))
    assert "3 batches (1 already done)" in result.output
    assert engine_calls == [64, 2]  # batch 0 reruns with batch 1, its group; then batch 2
    assert read_examples(out).equals(read_examples(full))
    assert sorted(p.name for p in (out / "parts" / "examples").iterdir()) == [
        "0.parquet",
        "1.parquet",
        "2.parquet",
    ]


def test_changed_config_needs_new_out_or_overwrite(position_run, tmp_path, common):
    full, _ = position_run
    out = tmp_path / "changed"
    shutil.copytree(full, out)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}

    result = invoke(*position_args(common, out, "--n", "1"), code=2)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    message = result.output.split("Error: ", 1)[1]
    assert "different configuration" in message and "options.n" in message
    assert "--overwrite" in message and "new --out" in message
    assert "\n" not in message.strip()  # one line
    assert "Traceback" not in result.output
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before  # nothing written

    invoke(*position_args(common, out, "--n", "1", "--templates", "movie", "--overwrite"))
    summary = pl.read_parquet(out / "summary.parquet")
    assert summary["graft"].to_list() == POSITION_GRAFTS["movie"]
    assert (summary["n"] == 1).all()
    assert sorted(p.name for p in (out / "parts" / "examples").iterdir()) == ["0.parquet"]
    assert read_examples(out).height == len(POSITION_GRAFTS["movie"])
    config = json.loads((out / "config.json").read_text())
    assert config["options"]["n"] == 1 and "resumes" not in config


# ------------------------------------------------------------------------------ bad input


BAD_INPUT = {
    "templates": (["position", "--templates", "headline,nope"], "templates nope: not in"),
    "positions": (["position", "--positions", "FE,FE+"], "--positions"),
    "positions-span": (["position", "--positions", "FE,XYZ"], "XYZ"),
    "necessity-positions": (["necessity", "--positions", "(FE"], "--positions"),
    "model": (["position", "--model", "no-such-model"], "unknown model 'no-such-model'"),
    "model-layers": (["layers", "--model", "no-such-model"], "unknown model 'no-such-model'"),
    "dataset": (["position", "--dataset", "no_such_kind"], "dataset 'no_such_kind' is neither"),
    "pairs": (["component", "--pairs", "sft,sideways"], "--pairs"),
    "component-layers": (["component", "--layers", "q5"], "--layers"),
    "component-fe": (["component", "--fe", "mpl"], "--fe"),
    "hybrid-layers": (["hybrid", "--lt-layers", "x"], "layer selector 'x'"),
    "windows": (["layers", "--windows", "thirds"], "--windows"),
    "windows-zero": (["layers", "--windows", "0"], "--windows"),
    "layers-components": (["layers", "--components", "mpl"], "unknown component 'mpl'"),
    "spec": (["custom", "--spec", "LT:h2:o,ffn", "--spec", "bad=FE:all"], "--spec"),
    "spec-component": (["custom", "--spec", "LT:all:mpl"], "unknown component 'mpl'"),
    "spec-donor": (["custom", "--spec", "LT:all:o@task"], "donor(s) ['task'] not loaded"),
    "donor": (["custom", "--spec", "LT:all:o", "--donor", "sft"], "--donor"),
    "tokens-spec": (["tokens", "--spec", "FE:q9:all"], "--spec"),
    # two grafts of one name were pooled into one row (doubled n, narrower CI), exit 0
    "spec-duplicate-name": (
        ["custom", "--spec", "a=FE:all:all", "--spec", "a=LT:all:all"],
        "two grafts are named 'a': 'FE:all:all' and 'LT:all:all'",
    ),
    "spec-named-PRE": (["custom", "--spec", "PRE=FE+LT:all:all"], "two grafts are named 'PRE'"),
    "spec-named-SFT": (["custom", "--spec", "SFT=LT:all:all"], "two grafts are named 'SFT'"),
    "tokens-named-PRE": (["tokens", "--spec", "PRE=LT:all:all"], "two grafts are named 'PRE'"),
    # nameless or empty grafts ran the base alone
    "spec-empty": (["custom", "--spec", ""], "empty spec"),
    "spec-name-only": (["custom", "--spec", "name="], "graft 'name': empty spec"),
    "spec-layer-range": (["custom", "--spec", "LT:9:o"], "layer 9"),
    "donor-variant": (
        ["custom", "--spec", "LT:all:o", "--donor", "sft=bogus"],
        "'bogus' is neither a variant (pretrained, one, both, task, relation",
    ),
    "device": (["custom", "--spec", "LT:all:o", "--device", "banana"], "unknown device"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_exits_2_and_writes_nothing(case, tmp_path, common, position_run):
    # position_run first: the shared workspace then holds the tiny donor (no finetune here)
    args, needle = BAD_INPUT[case]
    command, *options = args
    out = tmp_path / "out"
    result = invoke(command, *common, *options, "--out", str(out), code=2)
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    error = result.output.split("Error: ", 1)[1]
    assert needle in error, result.output
    assert_untouched(out)


def test_repeated_positions_run_once(tmp_path, common, position_run):
    """Repeated position sets were two grafts of one name, pooled into one row of n=2."""
    out = tmp_path / "position"
    args = ["--templates", "qa", "--n", "1"]
    invoke("position", *common, *args, "--positions", "FE,FE,LT", "--out", str(out))
    summary = pl.read_parquet(out / "summary.parquet")
    assert summary["graft"].to_list() == ["PRE", "SFT", "FE", "LT"]
    assert (summary["n"] == 1).all()
    out = tmp_path / "layers"
    invoke(
        "layers",
        *common,
        *args,
        "--positions",
        "LT,LT",
        "--windows",
        "halves",
        "--components",
        "o;o",
        "--out",
        str(out),
    )
    summary = pl.read_parquet(out / "summary.parquet")
    assert summary["graft"].to_list() == ["PRE", "SFT", "LT | h1", "LT | h2"]
    assert (summary["n"] == 1).all()


def test_unwritable_out_or_workspace_is_one_line(tmp_path, common, position_run):
    (tmp_path / "file").write_text("x")
    cases = [
        (["--out", "/proc/graft-x"], "cannot write the run folder /proc/graft-x"),
        (["--out", str(tmp_path / "file" / "run")], "cannot write the run folder"),
        (["--workspace", str(tmp_path / "file" / "ws")], "in the workspace"),
    ]
    for options, needle in cases:
        result = invoke("custom", *common, "--spec", "LT:all:o", *options, code=2)
        error = result.output.split("Error: ", 1)[1].strip()
        assert needle in error and "\n" not in error, result.output
    assert not Path("/proc/graft-x").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_overwrite_refuses_a_model_folder(tmp_path, common, position_run):
    """--overwrite pointed at a model folder once deleted its config.json."""
    out, _ = position_run
    model = tmp_path / "model"
    shutil.copytree(json.loads((out / "config.json").read_text())["donors"]["sft"]["path"], model)
    before = {p: p.read_bytes() for p in model.rglob("*") if p.is_file()}
    result = invoke(
        "custom", *common, "--spec", "LT:all:o", "--out", str(model), "--overwrite", code=2
    )
    assert "not a run folder" in result.output  # a model folder, named as such
    # component writes its combined results into --out itself, even without --overwrite
    result = invoke("component", *common, "--out", str(model), code=2)
    assert "not a run folder" in result.output  # a model folder, named as such
    assert {p: p.read_bytes() for p in model.rglob("*") if p.is_file()} == before


def test_failed_start_then_rerun_in_the_default_folder(tmp_path, common, position_run, monkeypatch):
    """A failed start left config.json in the default folder; the corrected rerun was refused."""
    monkeypatch.chdir(tmp_path)
    base = ["custom", *common, "--templates", "qa", "--n", "1"]
    invoke(*base, "--spec", "LT:9:o", code=2)
    assert not (tmp_path / "runs").exists()
    invoke(*base, "--spec", "LT:3:o")
    (folder,) = (tmp_path / "runs" / "custom").iterdir()
    assert pl.read_parquet(folder / "summary.parquet")["graft"].to_list() == [
        "PRE",
        "SFT",
        "LT:3:o",
    ]


def test_bad_input_then_good_input_in_same_out(tmp_path, common, position_run):
    """A failed start must not pin its config to the folder."""
    out = tmp_path / "out"
    invoke("position", *common, "--templates", "nope", "--out", str(out), code=2)
    invoke("position", *common, "--templates", "qa", "--positions", "LT", "--out", str(out))
    assert pl.read_parquet(out / "summary.parquet")["graft"].to_list() == ["PRE", "SFT", "LT"]


# --------------------------------------------------------------------- numbers vs. engine


def test_position_numbers_match_engine(position_run):
    """Stored target log-probs equal an independent run of the engine on the same models,
    PRE equals the base's plain forward and SFT the donor's."""
    out, _ = position_run
    config = json.loads((out / "config.json").read_text())
    base = load_model(config["base"]["path"], dtype="float32", device="cpu")
    donor = load_model(config["donors"]["sft"]["path"], dtype="float32", device="cpu")
    tok = base.tokenizer
    table = read_examples(out)
    data = Path(config["dataset"]["path"])
    examples, _ = load_test_prompts(data, tok, list(TEMPLATES))
    by_id = {ex.prompt_id: ex for ex in examples}

    # one prompt per template, every graft of it
    picked = [table.filter(pl.col("template") == t)["prompt_id"][0] for t in TEMPLATES]
    rows = table.filter(pl.col("prompt_id").is_in(picked))
    assert rows.height == sum(len(g) for g in POSITION_GRAFTS.values())
    graft_rows = stored_graft_rows(rows, by_id)
    logprobs = run_grafts(
        base.model,
        {"sft": donor.model},
        graft_rows,
        batch_size=7,
        log_probs=True,
        pad_id=tok.pad_token_id,
    )
    targets = torch.tensor(rows["target_id"].to_list())
    recomputed = logprobs[torch.arange(len(targets)), targets].double()
    stored = torch.tensor(rows["target_logprob"].to_list(), dtype=torch.float64)
    torch.testing.assert_close(recomputed, stored, atol=LOGPROB_TOL, rtol=0)

    # references: PRE = plain base forward, SFT = plain donor forward (its own head)
    with torch.no_grad():
        for row in rows.filter(pl.col("graft").is_in(["PRE", "SFT"])).iter_rows(named=True):
            model = base.model if row["graft"] == "PRE" else donor.model
            ids = torch.tensor([by_id[row["prompt_id"]].input_ids])
            plain = model(ids).logits[0, -1].float().log_softmax(-1)
            assert abs(float(plain[row["target_id"]]) - row["target_logprob"]) <= LOGPROB_TOL
            top = plain.exp()[row["top10_ids"]].double()
            torch.testing.assert_close(
                top, torch.tensor(row["top10_probs"], dtype=torch.float64), atol=LOGPROB_TOL, rtol=0
            )
            assert float(top.min()) >= float(plain.exp().topk(10).values[-1]) - LOGPROB_TOL
    # the donor is not the base: SFT's numbers differ from PRE's
    pre = rows.filter(pl.col("graft") == "PRE")["target_logprob"].to_list()
    sft = rows.filter(pl.col("graft") == "SFT")["target_logprob"].to_list()
    assert pre != sft


def test_quiet_hides_every_progress_bar(tmp_path, common, position_run):
    import transformers

    transformers.utils.logging.enable_progress_bar()  # undo earlier --quiet runs in this process
    result = invoke("custom", *common, "--spec", "LT:all:o", "--out", str(tmp_path / "q"))
    assert "Loading weights" not in result.output
    assert "it/s" not in result.output and "row/s" not in result.output
