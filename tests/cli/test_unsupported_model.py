"""A model of an architecture graft has no family table for (a tiny OPT folder) and a
mistyped model folder: every command, run or ``--dry-run``, ends in one line, exit 2, with
nothing made in the workspace."""

from __future__ import annotations

from pathlib import Path

import pytest
import transformers
from click.testing import CliRunner

from graft.core.families.arch import family_of_config
from graft.errors import ModelNotFoundError, UnsupportedModelError
from graft.models import missing_folder, resolve_model_name
from graft.models.paper import scaled_down
from graft_experiments.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def opt_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random OPT model saved by save_pretrained (OPT has no family table)."""
    folder = tmp_path_factory.mktemp("models") / "tiny-opt"
    config = transformers.OPTConfig(
        hidden_size=32,
        num_hidden_layers=2,
        ffn_dim=64,
        num_attention_heads=2,
        vocab_size=100,
        max_position_embeddings=64,
        word_embed_proj_dim=32,
    )
    transformers.OPTForCausalLM(config).save_pretrained(folder)
    return folder


def test_a_config_of_a_supported_family_has_its_table() -> None:
    assert family_of_config(scaled_down("llama3.2-1b")).name == "llama"
    assert family_of_config(scaled_down("gpt2-xl")).name == "gpt2"


def test_a_config_of_another_family_is_refused_with_the_supported_ones() -> None:
    with pytest.raises(UnsupportedModelError, match=r"model type 'opt' .*supported families"):
        family_of_config(transformers.OPTConfig())


@pytest.mark.parametrize(
    "args",
    [
        ["position", "--n-facts", "5", "--n", "2"],
        ["position", "--n-facts", "5", "--n", "2", "--dry-run"],
        ["finetune"],
        ["finetune", "--dry-run"],
        ["custom", "--spec", "FE:all:all", "--n", "2"],
        ["custom", "--spec", "FE:all:all", "--n", "2", "--dry-run"],
        # no memory plan: the runner and the donor job check the family themselves
        ["custom", "--spec", "FE:all:all", "--n", "2", "--skip-memory-check"],
        ["finetune", "--skip-memory-check"],
    ],
    ids=lambda args: " ".join(a for a in args if a.startswith(("--d", "--s", "p", "f", "c"))),
)
def test_every_command_refuses_an_unsupported_model_in_one_line(
    args: list[str], opt_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRAFT_HOME", str(tmp_path / "home"))
    workspace = tmp_path / "ws"
    command = [*args, "--model", str(opt_folder), "--workspace", str(workspace), "--quiet"]
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.exception is not None
    assert isinstance(result.exception, SystemExit)
    line = result.output.strip().splitlines()[-1]
    assert "model type 'opt'" in line and "supported families: gpt2" in line
    # nothing made: no dataset generated, no finetune started, no lock taken
    assert not workspace.exists() or sorted(p.name for p in workspace.iterdir()) == []


def test_a_missing_folder_under_an_existing_one_is_not_a_hub_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ws").mkdir()
    for name in ("ws/finetuned-cpu-e1", "./ws/finetuned-cpu-e1", str(tmp_path / "nowhere/x")):
        with pytest.raises(ModelNotFoundError, match="no model folder .*does not exist"):
            resolve_model_name(name)
    message = missing_folder("ws/finetuned-cpu-e1") or ""
    assert str(tmp_path / "ws" / "finetuned-cpu-e1") in message and str(tmp_path / "ws") in message


def test_a_hub_id_without_a_folder_of_its_owner_stays_a_hub_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GRAFT_MODELS", raising=False)
    assert missing_folder("HuggingFaceTB/SmolLM2-135M") is None
    assert resolve_model_name("HuggingFaceTB/SmolLM2-135M") == ("hub", "HuggingFaceTB/SmolLM2-135M")


def test_a_mistyped_donor_folder_is_said_missing_not_a_download_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRAFT_HOME", str(tmp_path / "home"))
    (tmp_path / "ws").mkdir()
    args = ["custom", "--spec", "FE:all:all", "--model", "tiny-llama", "--workspace", "ws"]
    args += ["--n", "2", "--donor", "sft=ws/finetuned-cpu-e1", "--quiet"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert "no model folder" in line and "finetuned-cpu-e1" in line
    assert "cannot download" not in result.output and "Traceback" not in result.output
