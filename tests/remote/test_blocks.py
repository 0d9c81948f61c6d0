"""Ship mode over the payload limit: batches split between layers (graft.remote.blocks).

A split run must give the unsplit run's numbers bit for bit (and the local engine's to
rounding), send the requests the block plan says with the donor modules of each block only,
and refuse what cannot be split (one module over the limit) in one line naming it.
"""

from __future__ import annotations

import pytest
import torch

from graft.core.execution.engine import LocalExecutor, run_grafts, score_grafts
from graft.core.families.arch import architecture_of
from graft.core.planning.plan import plan_batch, resolve_rows
from graft.errors import RemoteError
from graft.models.paper import meta_model
from graft.models.tiny import perturbed_copy, tiny_config, tiny_model
from graft.remote.blocks import Block, plan_blocks, stage_of
from graft.remote.config import RemoteConfig, hf_model_key
from graft.remote.executor import RemoteExecutor
from graft.remote.payload import estimate_payload_bytes, module_bytes
from tests.engine_cases import E1_SPECS
from tests.fast_tier import slow_except

from .test_remote import make_rows

try:
    from tests.ndif_double import NdifDouble
except ImportError:  # tests/ is not a package: conftest puts it on sys.path
    from ndif_double import NdifDouble

KEY = hf_model_key("graft/tiny-llama")
BF16_KEY = hf_model_key("graft/tiny-llama-bf16")
EXACT_LOCAL = LocalExecutor(shortcuts=False)
#: an 8-layer tiny llama's donor weights are 12 KB (embeddings), 36 KB a layer, 12 KB the
#: head, 314 KB in all; 0.16 MB less what 16 rows' residual streams, masks and the trace take
#: leaves 76 KB per request
LIMIT_MB = 0.16
N_LAYERS = 8


@pytest.fixture(scope="module")
def pair():
    base = tiny_model("llama", n_layers=N_LAYERS)
    return base, perturbed_copy(base, seed=100)


@pytest.fixture(scope="module")
def server():
    import aiohttp  # noqa: F401  (the dev extra installs it: an ImportError is a broken install)
    from nnsight.modeling.transformers import TransformersModel

    from graft.models import tiny_tokenizer

    models = {
        KEY: TransformersModel(tiny_model("llama", n_layers=N_LAYERS), tokenizer=tiny_tokenizer()),
        BF16_KEY: TransformersModel(
            tiny_model("llama", n_layers=N_LAYERS).to(torch.bfloat16), tokenizer=tiny_tokenizer()
        ),
    }
    with NdifDouble(models, api_keys={"k"}) as double:
        yield double


def config(server, **kwargs) -> RemoteConfig:
    values = dict(mode="remote", host=server.url, api_key="k", model_key=KEY, retries=0)
    return RemoteConfig(**{**values, **kwargs})


def sizes(model) -> dict[str, int]:
    """Float32 bytes of the embeddings, one layer and the head of a tiny llama."""
    return {
        "embed": module_bytes([model.model.embed_tokens]),
        "layer": module_bytes([model.model.layers[0]]),
        "head": module_bytes([model.model.norm, model.lm_head]),
    }


@pytest.mark.slow
def test_a_split_e1_batch_is_the_unsplit_run_and_sends_each_block_once(server, pair):
    base, donor = pair
    rows = make_rows(E1_SPECS, n_prompts=2)  # 16 rows
    local = run_grafts(base, donor, rows, batch_size=8)
    exact = run_grafts(base, donor, rows, batch_size=8, executor=EXACT_LOCAL)
    executor = RemoteExecutor(config(server, max_payload_mb=LIMIT_MB))
    n_before = len(server.requests)
    got = run_grafts(base, donor, rows, batch_size=8, executor=executor)
    assert torch.equal(got, exact)
    assert (got - local).abs().max().item() <= 1e-5
    size = sizes(donor)
    # greedy in forward order under 76 KB: embeddings + layer 0, two layers at a time,
    # layer 7 + the head; both batches (16 rows) in each request
    assert [(s.block, s.rows, s.batches, s.payload) for s in executor.sent] == [
        ("embeddings and layer 0 of 8", 16, 2, size["embed"] + size["layer"]),
        *[(f"layers {i}-{i + 1} of 8", 16, 2, 2 * size["layer"]) for i in (1, 3, 5)],
        ("layer 7 of 8 and the head", 16, 2, size["layer"] + size["head"]),
    ]
    whole = estimate_payload_bytes(base, "ALL:all:all; head=donor")
    assert sum(s.payload for s in executor.sent) == whole  # every module shipped once
    seen = server.requests[n_before:]
    limit = RemoteConfig(max_payload_mb=LIMIT_MB).max_payload_bytes
    assert [r.outcome for r in seen] == ["completed"] * 5
    for record, sent in zip(seen, executor.sent, strict=True):
        assert sent.sent == record.payload_bytes  # what the client measured arrived
        assert sent.payload < record.payload_bytes <= limit


@pytest.mark.slow
def test_a_weightless_client_base_ships_only_the_donor(server, pair):
    """Ship mode needs the base's module tree here, not its weights: a meta copy will do."""
    base, donor = pair
    rows = make_rows(E1_SPECS[1:4], n_prompts=2)
    exact = run_grafts(base, donor, rows, executor=EXACT_LOCAL)
    client = meta_model(tiny_config("llama", n_layers=N_LAYERS))
    executor = RemoteExecutor(config(server, max_payload_mb=LIMIT_MB))
    assert torch.equal(run_grafts(client, donor, rows, executor=executor), exact)
    assert len(executor.sent) > 1


@pytest.mark.slow
def test_a_bfloat16_server_gets_its_own_residual_stream_back(server, pair):
    """The residual stream travels in the server's dtype: split equals unsplit there too."""
    base, donor = pair
    rows = make_rows(["LT:all:all", "FE+LT:all:all"], n_prompts=2)
    whole = run_grafts(
        base, donor, rows, executor=RemoteExecutor(config(server, model_key=BF16_KEY))
    )
    cfg = config(server, model_key=BF16_KEY, max_payload_mb=0.2)
    executor = RemoteExecutor(cfg)
    assert torch.equal(run_grafts(base, donor, rows, executor=executor), whole)
    assert len(executor.sent) > 1


@pytest.mark.parametrize("family", slow_except(["gpt2", "gpt_neox", "gemma3", "qwen3"], "gpt_neox"))
def test_every_family_splits_exactly(tiny_pairs, family):
    """Tied heads, fused QKV, learned positions, q/k norms: the simulated split run is the
    one-pass run bit for bit, metrics included."""
    base, donor = tiny_pairs(family, tied=True if family == "gpt2" else None, n_layers=N_LAYERS)
    rows = make_rows(E1_SPECS[:5], n_prompts=2)
    targets = [(5 * i) % 96 for i in range(len(rows))]
    kw = dict(batch_size=4, top_k=3)
    local = score_grafts(base, donor, rows, targets, executor=EXACT_LOCAL, **kw)
    executor = RemoteExecutor(RemoteConfig(mode="simulate", max_payload_mb=LIMIT_MB))
    got = score_grafts(base, donor, rows, targets, executor=executor, **kw)
    assert sum(s.block is not None for s in executor.sent) > 1
    for name, value in local.items():
        assert torch.equal(got[name], value), name


@pytest.mark.slow
def test_batches_that_fit_are_packed_as_before_around_split_ones(pair):
    """Only the batches over the limit are split; the rest go whole, in order."""
    base, donor = pair
    arch = architecture_of(base)
    small = make_rows(["LT:-1:o"], n_prompts=2)
    big = make_rows(["ALL:all:all"], n_prompts=2, seed=1)
    plans = []
    for rows in (small, big, big, small):
        resolved = resolve_rows(arch, rows, {"sft": donor})
        plans.append(plan_batch(arch, rows, pad_id=0, padding_side="left", resolved=resolved))
    executor = RemoteExecutor(RemoteConfig(mode="simulate", max_payload_mb=LIMIT_MB))
    got = list(executor.run(base, {"sft": donor}, plans))
    for plan, logits in zip(plans, got, strict=True):
        assert torch.equal(logits, EXACT_LOCAL.run_plan(base, {"sft": donor}, plan))
    blocks = [s.block for s in executor.sent]
    assert blocks[0] is None and blocks[-1] is None  # the small batches, whole
    assert len(blocks) > 3 and all(blocks[1:-1])  # both big batches in the same blocks
    assert all(s.batches == 2 for s in executor.sent[1:-1])
    # at most rows_per_request rows share split requests: then each big batch has its own
    alone = RemoteExecutor(
        RemoteConfig(mode="simulate", max_payload_mb=LIMIT_MB, rows_per_request=2)
    )
    list(alone.run(base, {"sft": donor}, plans))
    assert [s.batches for s in alone.sent] == [1] * (2 * len(blocks) - 2)


def test_one_module_over_the_limit_is_one_line_naming_it(server, pair):
    base, donor = pair
    rows = make_rows(["FE+LT:all:all"], n_prompts=1)
    n_before = len(server.requests)
    # ~10 KB for donor weights: every layer module fits alone, the 12 KB embeddings do not
    executor = RemoteExecutor(config(server, max_payload_mb=0.0732))
    with pytest.raises(RemoteError) as info:
        run_grafts(base, donor, rows, executor=executor)
    err = info.value
    assert err.kind == "payload" and "\n" not in str(err)
    assert "donor 'sft' module model.embed_tokens alone is 12.00 KB" in str(err)
    for fix in ("donor_mode='hosted'", "bfloat16", "raise max_payload_mb"):
        assert fix in str(err)
    assert len(server.requests) == n_before  # nothing was sent


def test_the_block_plan_is_the_fewest_blocks_and_counts_a_tied_tensor_once():
    gpt2 = tiny_model("gpt2", tied=True)
    arch = architecture_of(gpt2)
    assert [stage_of(arch, p) for p in ("transformer.wte", "transformer.h.2.mlp.c_fc")] == [-1, 2]
    assert stage_of(arch, "lm_head") == stage_of(arch, "transformer.ln_f") == 4
    embed, proj = ("sft", "transformer.wte"), ("sft", "transformer.h.1.attn.c_proj")
    head = ("sft", "lm_head")
    stages = {-1: {embed}, 1: {proj}, 4: {head}}

    def size_of(keys):
        return module_bytes([gpt2.get_submodule(path) for _, path in keys])

    wte = size_of([embed])
    assert size_of([embed, head]) == wte  # tied: one tensor
    (whole,) = plan_blocks(arch, stages, size_of, budget=2 * wte, limit=4 * wte)
    assert (whole.start, whole.stop, whole.payload) == (-1, 5, size_of([embed, proj]))
    split = plan_blocks(arch, stages, size_of, budget=wte, limit=4 * wte)
    assert [(b.start, b.stop) for b in split] == [(-1, 1), (1, 4), (4, 5)]  # fewest blocks
    labels = ["embeddings and layer 0 of 4", "layers 1-3 of 4", "the head"]
    assert [b.label() for b in split] == labels
    assert Block(2, 5, 4, "transformer.h", frozenset(), 0).label() == "layers 2-3 of 4 and the head"
    with pytest.raises(RemoteError, match=r"grafted in layer 1 take .* graft fewer components"):
        plan_blocks(
            arch,
            {1: {("sft", f"transformer.h.1.{m}") for m in ("attn.c_attn", "mlp.c_fc")}},
            size_of,
            budget=module_bytes([gpt2.transformer.h[1].mlp.c_fc]) + 1,
            limit=4 * wte,
        )
