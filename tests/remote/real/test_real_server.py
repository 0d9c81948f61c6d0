"""graft's remote runs against the real NDIF server (``ndif`` 0.1.x on CPU, scripts/ndif/).

Both donor modes, on the server's trusted (in-process) path and on its sandbox path
(untrusted code runs in a separate runner process that holds no weights), must give the
local engine's logits; failures must come back as one classified line.
"""

from __future__ import annotations

import logging
import os
import socket

import pytest
import torch

from graft.core.api.grafted_trace import trace
from graft.core.execution.engine import run_grafts, score_grafts
from graft.errors import RemoteError
from graft.models.loading import tiny_tokenizer
from graft.models.paper import meta_model
from graft.models.tiny import perturbed_copy, tiny_config, tiny_model
from graft.remote.client import server_versions
from graft.remote.config import RemoteConfig, hf_model_key
from graft.remote.executor import RemoteExecutor
from tests.engine_cases import E1_SPECS as E1

from ..test_remote import make_rows
from .conftest import REPORT, sandbox_path

SPECS = ["FE+LT:all:all", "LT:h2:o,ffn", "FE:all:all@sft; LT:h2:o,ffn@relation"]
TOLERANCE = 1e-5  # float32 on both sides; kernels may group sums differently across processes


@pytest.fixture(scope="module")
def llama():
    """The client's tiny llama and its donors: what the server's graft pair builds too."""
    base = tiny_model("llama")
    return base, {"sft": perturbed_copy(base, seed=100), "relation": perturbed_copy(base, seed=7)}


def config(server, mode: str, **kwargs) -> RemoteConfig:
    kwargs = {"timeout_s": 180, "retries": 0, "model_key": server.models[mode], **kwargs}
    return RemoteConfig(mode="remote", host=server.url, api_key="", donor_mode=mode, **kwargs)


def remote(base, donors, rows, cfg: RemoteConfig, **kwargs):
    """``run_grafts`` on the server ``cfg`` names."""
    return run_grafts(base, donors, rows, executor=RemoteExecutor(cfg), **kwargs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_vanilla_nnsight_trace_round_trips(ndif_server, server_path):
    """nnsight's own client, no graft code: a hidden state and the logits come back exact."""
    from nnsight.intervention.backends.remote import RemoteBackend
    from nnsight.modeling.transformers import TransformersModel

    from graft.models.loading import tiny_tokenizer

    model = TransformersModel(tiny_model("llama"), tokenizer=tiny_tokenizer())
    ids = torch.tensor([[1, 5, 6, 7, 8], [1, 9, 10, 11, 12]])

    def run(backend):
        with torch.no_grad(), model.trace(input_ids=ids, backend=backend):
            hidden = model.model.layers[1].mlp.output.save()
            logits = model.output.logits.save()
        return hidden, logits

    local = run(None)
    remote = run(RemoteBackend(ndif_server.models["ship"], host=ndif_server.url, api_key=""))
    for a, b in zip(local, remote, strict=True):
        assert (a - b).abs().max().item() <= TOLERANCE


def test_a_request_over_one_mib_arrives(ndif_server):
    """ndif's API refused every upload over 1 MiB until the harness imported anyio before
    nnsight (scripts/ndif/graft_ndif_api.py); real requests are hundreds of MiB."""
    from nnsight.intervention.backends.remote import RemoteBackend
    from nnsight.modeling.transformers import TransformersModel

    from graft.models.loading import tiny_tokenizer

    model = TransformersModel(tiny_model("llama"), tokenizer=tiny_tokenizer())
    ids = torch.tensor([[1, 5, 6, 7]])
    extra = torch.randn(1 << 20, generator=torch.Generator().manual_seed(0))  # 4 MiB

    def run(backend):
        with torch.no_grad(), model.trace(input_ids=ids, backend=backend):
            total = (model.model.layers[1].output.sum() + extra.sum()).save()
        return total

    backend = RemoteBackend(ndif_server.models["ship"], host=ndif_server.url, api_key="")
    assert (run(None) - run(backend)).abs().item() <= TOLERANCE * run(None).abs().item()


def test_the_sandbox_path_runs_the_trace_in_another_process(ndif_server):
    """The envelope's ``trusted`` flag really switches the server's path (the runner's PID)."""
    from nnsight.intervention.backends.remote import RemoteBackend
    from nnsight.modeling.transformers import TransformersModel

    from graft.models.loading import tiny_tokenizer

    model = TransformersModel(tiny_model("llama"), tokenizer=tiny_tokenizer())
    ids = torch.tensor([[1, 5, 6]])

    def pid() -> int:
        backend = RemoteBackend(ndif_server.models["ship"], host=ndif_server.url, api_key="")
        with torch.no_grad(), model.trace(input_ids=ids, backend=backend):
            where = torch.tensor(os.getpid()).save()
        return int(where)

    trusted = pid()
    with sandbox_path():
        sandboxed = {pid(), pid()}
    assert trusted != os.getpid()
    assert trusted not in sandboxed  # not the actor's process
    assert len(sandboxed) == 2  # a fresh runner per request


@pytest.mark.parametrize("mode", ["ship", "hosted"])
def test_remote_equals_local(ndif_server, server_path, llama, mode, caplog):
    base, donors = llama
    rows = make_rows(SPECS)
    local = run_grafts(base, donors, rows, batch_size=4)
    # hosted: the client holds no weights at all, only donor names
    client = (meta_model(tiny_config("llama")), list(donors)) if mode == "hosted" else llama
    with caplog.at_level(logging.INFO, logger="graft.remote"):
        got = remote(*client, rows, config(ndif_server, mode), batch_size=4)
    diff = (got - local).abs().max().item()
    REPORT.setdefault("max_abs_diff", {})[f"{mode}/{server_path}"] = diff
    assert got.shape == local.shape
    assert diff <= TOLERANCE
    assert "request 1/1: 9 rows in 3 batches" in caplog.text


def test_a_batch_over_the_payload_limit_runs_split_between_layers(ndif_server, server_path, llama):
    """Ship mode over the limit: one request per layer block, each with its block's donor
    modules and the residual stream entering it; the unsplit run's numbers, bit for bit."""
    base, donors = llama
    rows = make_rows(E1, n_prompts=1)  # the E1 grafts of one prompt: 8 rows, 173 KB of donor
    local = run_grafts(base, donors, rows)
    whole = remote(base, donors, rows, config(ndif_server, "ship"))
    cfg = config(ndif_server, "ship", max_payload_mb=0.12)  # 52 KB of donor weights a request
    executor = RemoteExecutor(cfg)
    got = run_grafts(base, donors, rows, executor=executor)
    diff = (got - local).abs().max().item()
    REPORT.setdefault("split", {})[server_path] = {
        "requests": len(executor.sent),
        "bytes_sent": [s.sent for s in executor.sent],
        "max_abs_diff": diff,
    }
    assert torch.equal(got, whole)
    assert diff <= TOLERANCE
    assert [s.block for s in executor.sent] == [
        "embeddings and layer 0 of 4",
        "layer 1 of 4",
        "layer 2 of 4",
        "layer 3 of 4 and the head",
    ]
    assert all(s.payload < s.sent <= cfg.max_payload_bytes for s in executor.sent)


def test_a_server_side_exception_is_one_classified_line(ndif_server, server_path, llama):
    """A hosted pair without the donor the spec asks for: the server's own error comes back."""
    base, _ = llama
    rows = make_rows(["LT:h2:ffn@ghost"], n_prompts=1)
    with pytest.raises(RemoteError) as info:
        remote(meta_model(tiny_config("llama")), ["ghost"], rows, config(ndif_server, "hosted"))
    err = info.value
    assert err.kind == "server"
    assert "\n" not in str(err)
    assert "ghost" in (err.detail or "") + str(err)


def test_an_unknown_model_key_says_the_server_does_not_serve_it(ndif_server, llama):
    base, donors = llama
    rows = make_rows(["LT:h2:ffn"], n_prompts=1)
    key = hf_model_key("graft/not-deployed-here")
    with pytest.raises(RemoteError) as info:
        remote(base, donors, rows, config(ndif_server, "ship", model_key=key))
    assert info.value.kind == "model", str(info.value)
    assert key in str(info.value)
    assert "\n" not in str(info.value)


def test_a_dead_host_is_unreachable(llama):
    base, donors = llama
    rows = make_rows(["LT:h2:ffn"], n_prompts=1)
    cfg = RemoteConfig(
        mode="remote",
        host=f"http://127.0.0.1:{_free_port()}",
        api_key="",
        model_key=hf_model_key("graft/tiny-llama"),
        retries=0,
        timeout_s=10,
    )
    with pytest.raises(RemoteError) as info:
        remote(base, donors, rows, cfg)
    assert info.value.kind == "unreachable"
    assert "cannot reach the NDIF host" in str(info.value)


def test_no_result_in_time_is_a_timeout(ndif_server, llama):
    base, donors = llama
    rows = make_rows(["LT:h2:ffn"], n_prompts=1)
    with pytest.raises(RemoteError) as info:
        remote(base, donors, rows, config(ndif_server, "ship", timeout_s=0.001))
    assert info.value.kind == "timeout"
    assert "raise timeout_s" in str(info.value)


def test_a_request_over_the_payload_limit_is_refused_before_sending(ndif_server, llama, caplog):
    base, donors = llama
    rows = make_rows(["FE+LT:all:all"], n_prompts=1)
    cfg = config(ndif_server, "ship", max_payload_mb=0.01)  # the donor weights are ~150 KB
    with caplog.at_level(logging.INFO, logger="graft.remote"), pytest.raises(RemoteError) as info:
        remote(base, donors, rows, cfg)
    assert info.value.kind == "payload"
    assert "hosted" in str(info.value)  # says what to do instead
    assert "request 1/1" not in caplog.text  # nothing was sent


def test_the_servers_versions_are_read_for_the_run_config(ndif_server):
    versions = server_versions(config(ndif_server, "ship"), timeout_s=60)
    assert versions is not None
    assert versions["host"] == ndif_server.url
    assert versions["ndif"] == ndif_server.versions["ndif"]
    assert versions["nnsight"].startswith("0.8.")
    assert versions["python"].startswith("3.12")
    assert "graft" in versions  # hosted graft pairs need graft on the server
    assert server_versions(RemoteConfig(mode="simulate")) is None


@pytest.mark.parametrize("mode", ["ship", "hosted"])
def test_small_results_are_the_local_metrics(ndif_server, server_path, llama, mode):
    """Per-row metrics computed inside the server's trace equal the local ones."""
    from nnsight.intervention.backends.remote import RemoteBackend

    base, donors = llama
    rows = make_rows(SPECS)
    targets = [(7 * i) % 96 for i in range(len(rows))]
    local = score_grafts(base, donors, rows, targets, batch_size=4, top_k=3)
    client = (meta_model(tiny_config("llama")), list(donors)) if mode == "hosted" else llama
    sizes: list[int] = []
    finalize = RemoteBackend.finalize

    def measured(self, content):
        sizes.append(len(content))
        return finalize(self, content)

    RemoteBackend.finalize = measured
    try:
        cfg = config(ndif_server, mode)
        got = score_grafts(
            *client, rows, targets, batch_size=4, top_k=3, executor=RemoteExecutor(cfg)
        )
        small = sum(sizes)
        sizes.clear()
        remote(*client, rows, cfg, batch_size=4)
        full = sum(sizes)
    finally:
        RemoteBackend.finalize = finalize
    assert torch.equal(got["target_rank"], local["target_rank"])
    assert torch.equal(got["top_ids"], local["top_ids"])
    for name in ("target_logprob", "top_logprobs"):
        assert (got[name] - local[name]).abs().max().item() <= TOLERANCE
    REPORT.setdefault("result_bytes_per_row", {})[f"{mode}/{server_path}"] = {
        "logits": round(full / len(rows), 1),
        "metrics_top3": round(small / len(rows), 1),
        "vocab": base.config.vocab_size,
    }
    assert small < full


TRACE_TEXTS = ["Keanu Reeves starred in a movie with", "Tom Hanks acted in"]
TRACE_FIELDS = [{"FE": "Keanu Reeves"}, {"FE": "Tom Hanks"}]
TRACE_SPEC = "FE+LT:all:all@sft; LT:h2:o,ffn@relation"
ZEROED_MLP = "model.layers.2.mlp"  # grafted at LT by both donors


def grafted_trace(base, donors, executor=None, write=True) -> dict[str, torch.Tensor]:
    """graft.trace of two texts: every layer's output saved, the grafted MLP of layer 2
    zeroed at LT (when ``write``) and saved, and the last-token logits."""
    import nnsight

    tok = tiny_tokenizer()
    with trace(
        base, donors, tok, TRACE_TEXTS, TRACE_SPEC, fields=TRACE_FIELDS, executor=executor
    ) as g:
        layers = [g.model.model.layers[i].output for i in range(2)]
        if write:
            g.model.get(ZEROED_MLP).output[:, -1] = 0
        mlp = g.model.get(ZEROED_MLP).output
        layers += [g.model.model.layers[i].output for i in range(2, 4)]
        saved = nnsight.save([*layers, mlp, g.logits])
    return {f"layer{i}": out for i, out in enumerate(saved[:4])} | {
        "mlp": saved[4],
        "logits": saved[5],
    }


@pytest.mark.parametrize("mode", ["ship", "hosted"])
def test_graft_trace_runs_on_the_server(ndif_server, server_path, llama, mode):
    """graft.trace with the remote executor: the user's block and the graft in one request.
    Every layer's output and g.logits equal the local graft.trace; the user's write (after
    the graft, at LT) is in what comes back and changes the logits as it does locally."""
    base, donors = llama
    local = grafted_trace(base, donors)
    unwritten = grafted_trace(base, donors, write=False)
    client = (meta_model(tiny_config("llama")), list(donors)) if mode == "hosted" else llama
    executor = RemoteExecutor(config(ndif_server, mode))
    got = grafted_trace(*client, executor=executor)
    assert got.keys() == local.keys()
    diffs = {}
    for name, want in local.items():
        assert got[name].shape == want.shape, name
        diffs[name] = (got[name] - want).abs().max().item()
    REPORT.setdefault("trace_max_abs_diff", {})[f"{mode}/{server_path}"] = max(diffs.values())
    assert max(diffs.values()) <= TOLERANCE, diffs
    assert torch.equal(got["mlp"][:, -1], torch.zeros_like(got["mlp"][:, -1]))
    # the write matters: without it the logits are elsewhere
    assert (unwritten["logits"] - local["logits"]).abs().max().item() > 1e-3
