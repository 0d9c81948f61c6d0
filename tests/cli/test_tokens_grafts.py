"""``graft-exp tokens --grafts paper``: the one graft the paper's top-10 tables (C.7) show per
model family, end to end on a tiny model of every family.

The expected graft per family is read from the paper, not from graft's table: C.7.1 Llama3
FE^C, C.7.2 Gemma LT, C.7.3 GPT-2 XL (FE+LT)^C. Families the paper has no table of take
the nearest one's: Pythia (GPT-NeoX) GPT-2 XL's, Gemma 2 and 3 Gemma's, Qwen Llama's.
"""

from __future__ import annotations

import json

import polars as pl
import pytest
from click.testing import CliRunner

from graft.models.tiny import TINY_FAMILIES
from graft_experiments.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

#: family -> (the paper's graft, the paper model whose table it is)
EXPECTED = {
    "llama": ("FE^C", "llama3.2-1b"),
    "qwen2": ("FE^C", "llama3.2-1b"),
    "qwen3": ("FE^C", "llama3.2-1b"),
    "gemma": ("LT", "gemma-1.1-2b"),
    "gemma2": ("LT", "gemma-1.1-2b"),
    "gemma3": ("LT", "gemma-1.1-2b"),
    "gpt2": ("(FE+LT)^C", "gpt2-xl"),
    "gpt_neox": ("(FE+LT)^C", "gpt2-xl"),
}


def _tokens(workspace, out, *args: str):
    return CliRunner().invoke(
        main,
        [
            "tokens",
            *args,
            "--workspace",
            str(workspace),
            "--out",
            str(out),
            "--templates",
            "headline",
            "--n",
            "2",
            "--n-facts",
            "4",
            "--finetune-max-steps",
            "2",
            "--n-boot",
            "10",
            "--per-graft",
            "1",
            "--quiet",
        ],
    )


def test_every_tiny_family_has_an_expected_graft():
    assert set(EXPECTED) == set(TINY_FAMILIES)


@pytest.mark.parametrize("family", ["llama", "gemma", "gpt2", "gpt_neox", "gemma3"])
def test_paper_grafts_take_the_familys_default(family, workspace, tmp_path):
    out = tmp_path / family
    result = _tokens(workspace, out, "--model", f"tiny-{family}", "--grafts", "paper")
    assert result.exit_code == 0, result.output
    positions, paper_model = EXPECTED[family]
    line = next(x for x in result.output.splitlines() if x.startswith("--grafts paper:"))
    assert f"tiny-{family} ({family} family) takes the paper's {positions} graft" in line
    assert f"token table of {paper_model}" in line and "nearest" in line
    examples = pl.read_parquet(out / "examples.parquet")
    specs = dict(examples.select("graft", "spec").unique().iter_rows())
    assert specs == {
        "PRE": "none",
        "SFT": "ALL:all:all; head=donor",
        positions: f"{positions}:all:all",
    }
    assert set(pl.read_parquet(out / "top_tokens.parquet")["graft"]) == {"PRE", "SFT", positions}
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert config["paper_graft"] == line.removeprefix("--grafts paper: ")


def test_paper_grafts_follow_the_protocol_head_policy(workspace, tmp_path):
    out = tmp_path / "paper"
    args = ("--model", "tiny-gemma", "--grafts", "paper", "--protocol", "paper")
    result = _tokens(workspace, out, *args)
    assert result.exit_code == 0, result.output
    specs = set(pl.read_parquet(out / "examples.parquet")["spec"])
    assert "LT:all:all; head=paper; protocol=paper" in specs


def test_paper_grafts_refuse_a_spec(workspace, tmp_path):
    args = ("--model", "tiny-llama", "--grafts", "paper", "--spec", "LT:all:all")
    result = _tokens(workspace, tmp_path / "both", *args)
    assert result.exit_code == 2
    assert "--grafts paper chooses the graft itself; leave out --spec" in result.output
    assert not (tmp_path / "both").exists()


def test_without_grafts_paper_the_three_position_grafts_stay(workspace, tmp_path):
    out = tmp_path / "default"
    result = _tokens(workspace, out, "--model", "tiny-llama")
    assert result.exit_code == 0, result.output
    assert "--grafts paper" not in result.output
    grafts = set(pl.read_parquet(out / "top_tokens.parquet")["graft"])
    assert grafts == {"PRE", "SFT", "FE", "LT", "FE+LT"}


def test_paper_grafts_have_their_own_default_run_folder(workspace, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["tokens", "--model", "tiny-llama", "--workspace", str(workspace)]
    args += ["--templates", "headline", "--n", "1", "--n-facts", "4", "--finetune-max-steps", "2"]
    args += ["--n-boot", "10", "--per-graft", "1", "--quiet"]
    assert CliRunner().invoke(main, args).exit_code == 0
    paper = CliRunner().invoke(main, [*args, "--grafts", "paper"])
    assert paper.exit_code == 0, paper.output  # not refused by the first run's folder
    runs = sorted(p.name for p in (tmp_path / "runs" / "tokens").iterdir())
    assert runs == [
        "tiny-llama-fake_movies_real_actors-paper-grafts-seed0",
        "tiny-llama-fake_movies_real_actors-seed0",
    ]
