"""The paper's four models the way researchers hold them: from the hub, or from a folder.

No machine here reaches the hub, so each model is built from its published config at a small
size (:func:`graft.models.paper.scaled_down`: the same family code paths), saved as a
``save_pretrained`` folder under ``$GRAFT_MODELS``, and run through a whole command. Offline
and without a folder, a paper model is one line, at once, naming what to do.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from transformers import AutoModelForCausalLM

import graft.models.loading as loading
from graft.core.families.arch import architecture_of
from graft.models import MODELS_ENV, load_model, resolve_model_name
from graft.models.loading import tiny_tokenizer
from graft.models.paper import PAPER_CONFIGS, paper_mismatch, paper_name, scaled_down
from graft_experiments.cli import main
from tests.fast_tier import slow_except

pytestmark = pytest.mark.usefixtures("one_thread")

#: name -> (architecture family, what of the family's code path the small copy keeps)
FAMILIES = {
    "gpt2-xl": "gpt2",
    "pythia-2.8b": "gpt_neox",
    "llama3.2-1b": "llama",
    "gemma-1.1-2b": "gemma",
}


@pytest.fixture(scope="module")
def models_folder(tmp_path_factory):
    """``$GRAFT_MODELS`` with a small copy of each paper model, under its short name."""
    root = tmp_path_factory.mktemp("models")
    for i, name in enumerate(PAPER_CONFIGS):
        torch.manual_seed(i)
        model = AutoModelForCausalLM.from_config(scaled_down(name))
        model.save_pretrained(root / name)
        tiny_tokenizer().save_pretrained(root / name)
    return root


def test_the_four_paper_models_are_registered():
    assert set(PAPER_CONFIGS) == set(FAMILIES)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_paper_model_loads_from_the_models_folder(name, models_folder, monkeypatch):
    monkeypatch.setenv(MODELS_ENV, str(models_folder))
    assert resolve_model_name(name) == ("local", str(models_folder / name))
    loaded = load_model(name, device="cpu")
    config, arch = loaded.model.config, architecture_of(loaded.model)
    assert arch.family == FAMILIES[name] and arch.n_layers == 4
    published = PAPER_CONFIGS[name]()
    if name == "gpt2-xl":  # fused QKV in thirds, learned positions
        assert "pos_embed" in arch.components and any(
            s.fused == "thirds" for s in arch.table.layer_sites
        )
    elif name == "pythia-2.8b":  # parallel attention and MLP, rotary on a quarter of each head
        assert config.use_parallel_residual is True
        assert any(s.fused == "heads" for s in arch.table.layer_sites)
        assert config.rope_parameters["partial_rotary_factor"] == 0.25
    elif name == "llama3.2-1b":  # grouped-query attention, tied head
        assert config.num_key_value_heads < config.num_attention_heads
        assert arch.tied_embeddings == published.tie_word_embeddings is True
    else:  # gemma: GeGLU, embeddings scaled, tied head, one key/value head
        assert config.hidden_act == "gelu_pytorch_tanh" and config.num_key_value_heads == 1
        assert arch.tied_embeddings is True


def test_a_paper_name_holding_another_model_is_said_once_with_the_numbers(
    models_folder, monkeypatch, caplog
):
    """A 0.2 M-parameter model in $GRAFT_MODELS/gpt2-xl was once loaded and labelled gpt2-xl
    without a word (issue 54)."""
    monkeypatch.setenv(MODELS_ENV, str(models_folder))
    monkeypatch.setattr(loading, "_NAMED_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="graft.models.loading"):
        for _ in range(2):
            load_model("gpt2-xl", device="cpu")
    (line,) = [r.getMessage() for r in caplog.records if "named after" in r.getMessage()]
    assert f"{models_folder / 'gpt2-xl'} is named after the paper's gpt2-xl" in line
    assert "M parameters, gpt2, 4 layers, width 64, 4 heads, vocabulary 96" in line
    assert "1.56 B parameters, gpt2, 48 layers, width 1600, 25 heads, vocabulary 50257" in line


def test_a_folder_is_compared_with_the_paper_model_it_is_named_after():
    small, llama = scaled_down("llama3.2-1b"), PAPER_CONFIGS["llama3.2-1b"]()
    assert paper_mismatch("llama3.2-1b", "f", llama) is None  # the model itself
    assert paper_mismatch("meta-llama/Llama-3.2-1B", "f", llama) is None
    assert paper_mismatch("my-llama", "f", small) is None  # named after no paper model
    for name in ("llama3.2-1b", "meta-llama/Llama-3.2-1B", "/data/models/Llama-3.2-1B"):
        assert "named after the paper's llama3.2-1b" in (paper_mismatch(name, "f", small) or "")
    other = paper_mismatch("gpt2-xl", "f", llama) or ""  # another family, not only size
    assert "holds another model" in other and "llama, 16 layers" in other


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_main_command_runs_on_a_paper_model_from_its_folder(
    name, models_folder, tmp_path, monkeypatch
):
    monkeypatch.setenv(MODELS_ENV, str(models_folder))
    out, workspace = tmp_path / "run", tmp_path / "ws"
    args = [
        "position",
        "--model",
        name,
        "--workspace",
        str(workspace),
        "--n-facts",
        "10",
        "--finetune-max-steps",
        "2",
        "--n",
        "2",
        "--templates",
        "headline",
        "--n-boot",
        "20",
        "--quiet",
        "--out",
        str(out),
        "--allow-weak-donor",  # a random model learns nothing in 2 steps
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert (out / "examples.parquet").is_file()
    # the donor keeps the registry name's folder, wherever the weights came from
    assert (workspace / "finetuned" / name).is_dir()


@pytest.mark.parametrize(
    "name", slow_except(["llama3.2-1b", "gemma-1.1-2b", "gpt2-xl"], "llama3.2-1b", "gemma-1.1-2b")
)
def test_offline_without_a_folder_is_one_line_at_once(name, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty hub cache
    monkeypatch.delenv(MODELS_ENV, raising=False)
    args = ["position", "--model", name, "--workspace", str(tmp_path / "ws"), "--quiet"]
    started = time.monotonic()
    result = CliRunner().invoke(main, args)
    assert time.monotonic() - started < 30
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert "Traceback" not in result.output
    hub_id = {
        "llama3.2-1b": "meta-llama/Llama-3.2-1B",
        "gemma-1.1-2b": "google/gemma-1.1-2b-it",
    }.get(name, "openai-community/gpt2-xl")
    assert hub_id in line and MODELS_ENV in line and "save_pretrained" in line
    gated = name != "gpt2-xl"
    assert ("licence" in line and "HF_TOKEN" in line) is gated


def test_the_how_to_names_exactly_the_models_whose_folders_are_checked():
    """docs/how-to/your-model.md lists the models a folder-mismatch warning covers: the keys
    of PAPER_CONFIGS, and the registry's other hub models as not checked."""
    text = " ".join((Path(__file__).parents[2] / "docs/how-to/your-model.md").read_text().split())
    checked = re.search(r"named after one of the paper's four models \(([^:]*):", text)
    assert checked is not None
    assert re.findall(r"`([^`]+)`", checked.group(1)) == list(PAPER_CONFIGS)
    unchecked = re.search(r"A folder named ((?:`[^`]+`(?:, | or )?)+) is not checked", text)
    assert unchecked is not None
    names = re.findall(r"`([^`]+)`", unchecked.group(1))
    assert names and all(paper_name(n) is None for n in names)
    assert all(paper_name(n) == n for n in PAPER_CONFIGS)
