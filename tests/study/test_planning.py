"""The memory plan (graft.study.planning.memory, device_memory, run_plan) against exact counts on tiny
models, the published gpt2-xl's hand-counted size, and the fit verdicts and their fixes."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from graft.errors import GraftError, MemoryPlanError
from graft.models.paper import PAPER_CONFIGS
from graft.models.tiny import TINY_FAMILIES, tiny_config, tiny_model
from graft.study import RunRequest
from graft.study.planning import finetune_plan, run_plan
from graft.study.planning.device_memory import DeviceMemory, device_memory, needed_bytes, verdict
from graft.study.planning.memory import estimate_finetune_bytes, estimate_grafting_bytes
from graft.study.planning.model_size import saved_activation_bytes
from graft.study.specs.presets import CPU, PAPER, PAPER_BF16, FinetuneConfig

GIB = 2**30


def _param_bytes(model: torch.nn.Module) -> int:
    unique = {id(p): p for p in model.parameters()}
    return sum(p.numel() * p.element_size() for p in unique.values())


def _train_step(model: torch.nn.Module, batch: int, seq: int) -> tuple[int, int, int]:
    """One AdamW step: (gradient bytes after backward, optimizer-state bytes, saved
    activation bytes of the forward pass, counted by storage as autograd kept them)."""
    model.train()
    weights = {p.untyped_storage()._cdata for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage._cdata not in weights:
            saved[storage._cdata] = storage.nbytes()
        return tensor

    ids = torch.randint(3, model.config.vocab_size, (batch, seq))
    mask = torch.ones(batch, 1, seq, seq, dtype=torch.bool)  # as the plan's trace
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids, attention_mask=mask, labels=ids, use_cache=False).loss
    loss.backward()
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    optimizer.step()
    moments = sum(
        t.numel() * t.element_size()
        for state in optimizer.state.values()
        for name, t in state.items()
        if name in ("exp_avg", "exp_avg_sq")
    )
    return grads, moments, sum(saved.values())


@pytest.mark.parametrize("family", TINY_FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weights_gradients_and_adamw_state_are_exact(family, dtype):
    config = tiny_config(family)
    model = tiny_model(family).to(dtype)
    grads, moments, _ = _train_step(model, batch=2, seq=8)
    name = str(dtype).removeprefix("torch.")
    plan = estimate_finetune_bytes(config, dtype=name, batch_size=2, seq_len=8)
    assert plan.weights_bytes - plan_buffers(config) == _param_bytes(model)
    assert plan.gradients_bytes == grads
    assert plan.optimizer_bytes == moments
    assert plan.n_params * (4 if dtype == torch.float32 else 2) == _param_bytes(model)


def plan_buffers(config) -> int:
    """The buffer bytes the plan counts (as the model builds them, in float32)."""
    from graft.study.planning.model_size import model_size

    return model_size(config).buffer_bytes


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_the_meta_trace_saves_what_a_real_step_saves(family):
    """The activations traced on meta tensors against the same forward pass on real CPU
    tensors, within 15%: the meta kernels take attention's plain path, the CPU its fused
    one, which keeps less, or (GPT-NeoX, whose fused q/k/v it keeps whole) more."""
    torch.manual_seed(0)
    _, _, measured = _train_step(tiny_model(family), batch=4, seq=16)
    traced = saved_activation_bytes(tiny_config(family), dtype="float32", batch_size=4, seq_len=16)
    assert 0.85 * traced <= measured <= 1.15 * traced


def test_checkpointing_keeps_less():
    config = tiny_config("llama")
    full = saved_activation_bytes(config, dtype="float32", batch_size=4, seq_len=16)
    kept = saved_activation_bytes(
        config, dtype="float32", batch_size=4, seq_len=16, gradient_checkpointing=True
    )
    assert kept < full / 3
    lean = estimate_finetune_bytes(
        config, dtype="float32", batch_size=4, seq_len=16, gradient_checkpointing=True
    )
    assert kept < lean.activations_bytes < full  # plus one layer recomputed


@pytest.mark.slow
def test_gpt2_xl_float32_adamw_is_25_gb_before_activations():
    """gpt2-xl from its published config: V d + P d + L (12 d^2 + 13 d) + 2 d parameters
    (embeddings, 48 blocks of attention, MLP and two layer norms, the final norm; the head
    is the embedding), 16 bytes each in float32 AdamW."""
    v, p, d, n_layers = 50257, 1024, 1600, 48
    n = v * d + p * d + n_layers * (12 * d * d + 13 * d) + 2 * d
    assert n == 1_557_611_200
    plan = estimate_finetune_bytes(
        PAPER_CONFIGS["gpt2-xl"](), dtype="float32", batch_size=4, seq_len=128
    )
    assert plan.n_params == n
    held = plan.weights_bytes + plan.gradients_bytes + plan.optimizer_bytes
    assert held == 16 * n  # gpt2-xl has no buffers in transformers 5
    assert 24.9e9 < held < 25.0e9
    assert plan.peak_bytes > held  # activations, the loss head, the tied head's sum


def test_bfloat16_halves_weights_gradients_and_state():
    config = PAPER_CONFIGS["llama3.2-1b"]()
    wide = estimate_finetune_bytes(config, dtype="float32", batch_size=4, seq_len=32)
    narrow = estimate_finetune_bytes(config, dtype="bfloat16", batch_size=4, seq_len=32)
    buffers = plan_buffers(config)
    assert narrow.weights_bytes - buffers == (wide.weights_bytes - buffers) // 2
    assert narrow.gradients_bytes == wide.gradients_bytes // 2
    assert narrow.optimizer_bytes == wide.optimizer_bytes // 2
    assert narrow.peak_bytes < 0.55 * wide.peak_bytes
    mixed = estimate_finetune_bytes(config, dtype="mixed", batch_size=4, seq_len=32)
    assert mixed.weights_bytes == wide.weights_bytes and mixed.cast_bytes > 0
    graft16 = estimate_grafting_bytes(config, dtype="bfloat16", batch_size=8, seq_len=16)
    graft32 = estimate_grafting_bytes(config, dtype="float32", batch_size=8, seq_len=16)
    assert graft16.weights_bytes - 2 * buffers == (graft32.weights_bytes - 2 * buffers) // 2


def test_grafting_holds_base_and_donors_whole():
    config = tiny_config("gpt2")
    one = estimate_grafting_bytes(config, dtype="float32", batch_size=8, seq_len=16)
    three = estimate_grafting_bytes(config, dtype="float32", batch_size=8, seq_len=16, n_donors=3)
    model = tiny_model("gpt2")
    assert one.weights_bytes == 2 * _param_bytes(model) + 2 * plan_buffers(config)
    assert three.weights_bytes == 2 * one.weights_bytes
    assert three.peak_bytes - one.peak_bytes == one.weights_bytes


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: estimate_finetune_bytes(c, dtype="int8", batch_size=1, seq_len=1), "int8"),
        (lambda c: estimate_finetune_bytes(c, dtype="float32", batch_size=0, seq_len=1), "batch"),
        (
            lambda c: estimate_finetune_bytes(
                c, dtype="float32", batch_size=1, seq_len=1, optimizer="sgd"
            ),
            "sgd",
        ),
        (lambda c: estimate_grafting_bytes(c, dtype="mixed", batch_size=1, seq_len=1), "mixed"),
        (
            lambda c: estimate_grafting_bytes(
                c, dtype="float32", batch_size=1, seq_len=1, n_donors=-1
            ),
            "n_donors",
        ),
    ],
)
def test_bad_plan_inputs_are_one_line(call, message):
    with pytest.raises(GraftError, match=message):
        call(tiny_config("llama"))


# ----------------------------------------------------------------------- fits, fixes


def _memory(free_gib: float, device: str = "cpu") -> DeviceMemory:
    return DeviceMemory(device, "test", round(free_gib * GIB), round(2 * free_gib * GIB))


def test_verdicts():
    assert verdict(8 * GIB, _memory(10)) == "fits"
    assert verdict(int(9.5 * GIB), _memory(10)) == "tight"
    assert verdict(11 * GIB, _memory(10)) == "does not fit"
    assert verdict(11 * GIB, DeviceMemory("mps", "mps", None, None)) == "unknown"


def test_cpu_free_memory_is_memavailable():
    memory = device_memory("cpu")
    text = Path("/proc/meminfo").read_text()
    lines = dict(line.split(":", 1) for line in text.splitlines())
    available = int(lines["MemAvailable"].split()[0]) * 1024
    assert memory.total_bytes == int(lines["MemTotal"].split()[0]) * 1024
    assert abs(memory.free_bytes - available) < 512 * 2**20  # read moments apart


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from graft.study.data.datasets import generate_dataset
    from graft.study.specs.config import DatasetConfig

    out = tmp_path_factory.mktemp("data") / "facts"
    return generate_dataset(DatasetConfig(n_facts=10), out)


@pytest.fixture(scope="module")
def gpt2_xl(tmp_path_factory) -> str:
    """A folder holding gpt2-xl's published config and no weights: a model on this machine
    (a registry name offline would only have graft's copy of the config, and a run of it is
    not refused for memory: loading it fails first, and says why)."""
    folder = tmp_path_factory.mktemp("gpt2-xl")
    PAPER_CONFIGS["gpt2-xl"]().save_pretrained(folder)
    return str(folder)


@pytest.mark.slow
def test_a_paper_finetune_that_does_not_fit_names_the_lean_setting(dataset, gpt2_xl, tmp_path):
    """gpt2-xl with the paper preset on a device with 16 GiB free: float32 AdamW (24 GiB)
    does not fit, checkpointing alone neither, bfloat16 with checkpointing (12 GiB) does."""
    plan = finetune_plan.plan_finetune(gpt2_xl, dataset, PAPER, device="cpu", folder=tmp_path / "m")
    memory = _memory(16)
    assert verdict(plan.needed, memory) == "does not fit"
    (fix,) = finetune_plan.fixes_of(plan, memory)
    assert fix.startswith(
        "to fit the finetune: weights_dtype='bfloat16' with gradient_checkpointing ("
    )
    fix = finetune_plan.finetune_fix(plan, memory, presets_only=True)
    assert fix.startswith("to fit the finetune: preset='paper-bf16'")
    with pytest.raises(MemoryPlanError, match="skip_memory_check") as err:
        run_plan.check_fits(plan, memory)
    assert "weights_dtype='bfloat16'" in str(err.value) and "\n" not in str(err.value)
    lean = finetune_plan.plan_finetune(gpt2_xl, dataset, PAPER_BF16, device="cpu")
    assert lean.precision == "bfloat16" and lean.needed < 0.55 * plan.needed
    run_plan.check_fits(lean, memory)  # fits: no error
    assert finetune_plan.fixes_of(lean, memory) == []


@pytest.mark.slow
def test_a_finetune_nothing_fits_says_so(dataset, gpt2_xl):
    plan = finetune_plan.plan_finetune(gpt2_xl, dataset, PAPER, device="cpu")
    fix = finetune_plan.fixes_of(plan, _memory(4))[0]
    assert "no setting here makes it fit" in fix
    # one plan, one verdict: the fix names the GPU sizes the plan's own GPU line names,
    # for the same bytes, and says what they count
    gpu_line = next(line for line in plan.lines() if "on a GPU" in line)
    assert gpu_line.split("): ", 1)[1] in fix and plan.gpu_words() in fix


def test_finetune_plan_counts_texts_steps_and_tokens(dataset):
    """10 facts' texts, 80% of them trained on, 4 a step for 10 epochs; the longest text
    counted by the tiny model's character tokenizer (one token a character, plus <s>)."""
    from graft.study.data.training_data import load_fact_dataset

    texts = [r["text"] for r in load_fact_dataset(dataset).train]
    cfg = dataclasses.replace(PAPER, max_length=512)
    plan = finetune_plan.plan_finetune("tiny-llama", dataset, cfg, device="cpu")
    n_train = len(texts) - round(0.2 * len(texts))
    assert plan.n_texts == n_train
    assert plan.steps == 10 * math.ceil(n_train / 4)
    longest = max(len(t) for t in texts)  # a space merges with the next character
    assert plan.length.counted and longest // 2 <= plan.length.tokens <= longest + 1
    assert plan.precision == "float32"
    assert needed_bytes(plan.memory, "cpu") > plan.memory.peak_bytes  # the heap's share
    # the duration grows with the texts' mean length, not only with the parameters
    mean = sum(len(t) + 1 for t in texts) / len(texts)
    assert mean / 2 <= plan.length.mean <= mean + 1 <= plan.length.tokens + 1


def test_finetune_plan_weighs_generic_passages_as_the_mix_holds_them(dataset):
    """The gentle preset mixes one generic passage per fact text: the mean length is half the
    fact texts' and half the passages', however many passages the corpus has."""
    from graft.study.data.files import load_generic_texts
    from graft.study.data.training_data import load_fact_dataset
    from graft.study.specs.presets import GENTLE

    texts = [r["text"] for r in load_fact_dataset(dataset).train]
    generic = load_generic_texts()
    cfg = dataclasses.replace(GENTLE, max_length=512)
    plan = finetune_plan.plan_finetune("tiny-llama", dataset, cfg, device="cpu")
    lengths, _ = finetune_plan.token_lengths(
        texts + generic, finetune_plan.local_tokenizer("tiny-llama"), 512
    )
    fact, passage = lengths[: len(texts)], lengths[len(texts) :]
    n_train = len(texts) - round(0.2 * len(texts))
    n_generic = plan.n_texts - n_train
    want = (sum(fact) / len(fact) * n_train + sum(passage) / len(passage) * n_generic) / (
        n_train + n_generic
    )
    assert n_generic == round(GENTLE.generic_ratio * n_train) > 0
    assert plan.length.mean == pytest.approx(want)
    unweighted = sum(lengths) / len(lengths)
    assert abs(plan.length.mean - unweighted) > 1  # 61 passages against 8 texts: it matters


def test_finetune_precision_follows_the_preset_and_device():
    assert finetune_plan.finetune_precision(PAPER, "cuda") == "mixed"
    assert finetune_plan.finetune_precision(PAPER, "cpu") == "float32"
    assert finetune_plan.finetune_precision(PAPER_BF16, "cpu") == "bfloat16"


def test_new_finetune_fields_keep_old_folder_names():
    """A config at the new fields' defaults has the key it had before they existed, so donors
    finetuned before are found: ``cpu-2c5d5049`` is what graft named the cpu preset with
    seed 1 before ``weights_dtype`` and ``gradient_checkpointing``."""
    assert dataclasses.replace(CPU, seed=1).key() == "cpu-2c5d5049"
    assert dataclasses.replace(CPU, seed=1, gradient_checkpointing=True).key() != "cpu-2c5d5049"
    assert PAPER_BF16.key() == "paper-bf16"
    with pytest.raises(GraftError, match="weights_dtype"):
        FinetuneConfig("x", 1e-4, 0.0, 1, 1.0, weights_dtype="float16")


@pytest.mark.slow
def test_a_model_neither_here_nor_downloadable_is_left_to_its_loading(dataset, monkeypatch):
    """Offline, gpt2-xl by name has only graft's published config: its plan is printed, but
    a run is not refused for memory (loading it fails first, naming the folder options)."""
    monkeypatch.setattr(run_plan, "hub_reachable", lambda: False)
    plan = finetune_plan.plan_finetune("gpt2-xl", dataset, PAPER, device="cpu")
    assert not plan.model_here
    run_plan.check_fits(plan, _memory(4))  # no error


@pytest.mark.slow
def test_experiment_plan_without_a_tokenizer_counts_rows_on_the_stored_prompts(gpt2_xl, tmp_path):
    """A model whose tokenizer is not here: prompts and rows from the stored fields (M and R
    grafts only where a template has the field), the longest prompt from its characters."""
    from graft.study.running.runner import ExperimentConfig, ModelSource
    from graft.study.specs.grafts import position_grafts

    cfg = ExperimentConfig(
        "position", model=gpt2_xl, n_facts=10, workspace=str(tmp_path / "ws"), device="cpu"
    )
    grafts = position_grafts(("FE", "LT", "M"), "base")
    plan = run_plan.plan_experiment(
        RunRequest(specs=cfg, grafts=grafts, donors={"sft": ModelSource("one")})
    )
    assert not plan.counted and not (tmp_path / "ws").exists()
    # 10 facts x 3 templates; M (the movie title) only in the movie template's prompts
    assert plan.prompts == 30 and plan.grafts == 5
    assert plan.rows == 30 * 4 + 10 and plan.batches == math.ceil(plan.rows / 32)
    assert 5 < plan.length.tokens < 40
    assert "about 30 prompts" in "\n".join(plan.lines())
