"""A model's config without its weights (graft.models.configs): built, read from a folder, or
the published one; nothing downloaded (a chunked embedded model is assembled from its
installed chunks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from graft.errors import ModelNotFoundError
from graft.models import MODELS_ENV, configs
from graft.models.configs import local_tokenizer, model_config
from graft.models.paper import PAPER_CONFIGS
from graft.models.tiny import tiny_config


def test_tiny_models_are_built():
    found = model_config("tiny-gpt2")
    assert found.local and found.config.to_dict() == tiny_config("gpt2").to_dict()
    assert local_tokenizer("tiny-gpt2") is not None


@pytest.mark.slow
def test_a_folder_is_read_and_a_folder_without_a_vocabulary_has_no_tokenizer(tmp_path):
    config = tiny_config("llama", n_layers=3)
    config.save_pretrained(tmp_path)  # config.json alone
    found = model_config(str(tmp_path))
    assert found.local and found.origin == str(tmp_path)
    assert found.config.num_hidden_layers == 3
    assert local_tokenizer(str(tmp_path)) is None


@pytest.mark.parametrize("name", list(PAPER_CONFIGS))
def test_paper_models_offline_fall_back_to_the_published_config(name, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty hub cache
    monkeypatch.delenv(MODELS_ENV, raising=False)
    found = model_config(name)
    assert not found.local and "published" in found.origin
    assert found.config.to_dict() == PAPER_CONFIGS[name]().to_dict()
    assert local_tokenizer(name) is None
    assert not (tmp_path / "hf").exists()  # nothing fetched or cached


def test_other_hub_models_offline_have_no_config(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert model_config("EleutherAI/pythia-160m") is None
    with pytest.raises(ModelNotFoundError):
        model_config("no-such-model")


@pytest.mark.slow
def test_a_chunked_embedded_model_is_planned_on_a_fresh_machine(tmp_path, monkeypatch):
    # gemma3-270m ships its GGUF in chunks: on a machine where it was never loaded (an empty
    # $GRAFT_HOME) the plan still finds its config, from the chunks assembled on the spot
    monkeypatch.setenv("GRAFT_HOME", str(tmp_path / "home"))
    found = model_config("gemma3-270m")
    assert found is not None and found.local
    assert Path(found.origin).parent == tmp_path / "home" / "gguf"
    assert found.config.num_hidden_layers == 18
    assert not (tmp_path / "home" / "models").exists()  # assembled, not converted


def test_an_embedded_models_gguf_is_read_once_and_each_caller_gets_a_copy(tmp_path, monkeypatch):
    # a plan asks for a model's config more than once; parsing gemma3-270m's GGUF takes
    # seconds: the second call reads nothing
    monkeypatch.setenv("GRAFT_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(configs, "_GGUF_CONFIGS", {})
    found_files: list[str] = []
    read: list[Path] = []

    def fake_gguf(name: str) -> Path:
        found_files.append(name)
        return tmp_path / f"{name}.gguf"

    def fake_read(gguf: Path) -> object:
        read.append(gguf)
        return tiny_config("gemma3")

    monkeypatch.setattr(configs, "embedded_gguf", fake_gguf)
    monkeypatch.setattr(configs, "read_gguf_config", fake_read)
    first = configs._gguf_config("gemma3-270m")
    assert first is not None
    first.config.num_hidden_layers = 99  # a caller changing its copy
    second = configs._gguf_config("gemma3-270m")
    assert second is not None and (found_files, read) == (
        ["gemma3-270m"],
        [tmp_path / "gemma3-270m.gguf"],
    )
    assert second.origin == first.origin and second.config is not first.config
    assert second.config.num_hidden_layers == tiny_config("gemma3").num_hidden_layers
    monkeypatch.setenv("GRAFT_HOME", str(tmp_path / "other"))  # another home: its own file
    configs._gguf_config("gemma3-270m")
    assert len(read) == 2
