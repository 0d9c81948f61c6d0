"""Which nnsight wrapper graft traces with, small results, and the errors a real server adds.

The full proof (both donor modes on a real NDIF server's trusted and sandbox paths) is
tests/remote/real, run by scripts/ndif/ci.sh; these are the cheap checks of the same facts.
"""

from __future__ import annotations

import http.server
import json
import threading

import pytest
import torch

from graft.core.execution.engine import LocalExecutor, run_grafts, score_grafts
from graft.core.families.wrapping import wrap
from graft.core.language.spec import parse_spec
from graft.core.planning.plan import GraftRow
from graft.errors import RemoteError, SpecError
from graft.models.tiny import perturbed_copy, tiny_model
from graft.remote.client import classify, server_versions
from graft.remote.config import RemoteConfig, hf_model_key
from graft.remote.executor import RemoteExecutor
from graft.remote.hosted import GraftPairModel, PairBase, wrap_pair_base


def _traced_fn_name(model) -> str:
    """The forward a trace of ``model`` records: a sandboxed NDIF server calls it by name."""
    tracer = model.trace(input_ids=torch.tensor([[1, 5, 6]]))
    fn = tracer.fn if hasattr(tracer, "fn") else tracer.args[0]
    return fn if isinstance(fn, str) else fn.__name__


def test_hf_models_are_traced_as_the_transformers_model_ndif_serves():
    from nnsight.modeling.transformers import TransformersModel

    base = tiny_model("llama")
    wrapped = wrap(base)
    assert isinstance(wrapped, TransformersModel)
    assert wrapped._module is base  # no copy of the weights
    assert wrap(base) is wrapped  # cached
    assert _traced_fn_name(wrapped) == "_call"


def test_hosted_mode_traces_through_the_pairs_forward_method():
    base = tiny_model("llama")
    client = wrap_pair_base(base)
    assert isinstance(client, PairBase) and client._module is base
    assert wrap_pair_base(base) is client  # cached
    assert _traced_fn_name(client) == "_call"
    pair = GraftPairModel("graft.tiny:llama", donors={"sft": "graft.tiny:llama:donor"})
    assert _traced_fn_name(pair) == "_call"  # what the server's pair runs by that name


def test_a_hosted_donor_the_local_pair_lacks_is_named_before_tracing():
    base = tiny_model("llama")
    pair = GraftPairModel(base, donors={"sft": perturbed_copy(base)})
    rows = [GraftRow([1, 5, 6], {}, parse_spec("LT:0:ffn@ghost"))]
    executor = RemoteExecutor(RemoteConfig(mode="simulate", donor_mode="hosted"))
    with pytest.raises(RemoteError, match="the graft pair has no donor 'ghost'") as info:
        run_grafts(pair, ["ghost"], rows, executor=executor)
    assert info.value.kind == "config"


class _NotNdif(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_error(404)

    do_POST = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture
def other_server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotNdif)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_host_without_nnsights_websocket_is_a_protocol_error(other_server):
    base = tiny_model("llama")
    cfg = RemoteConfig(
        mode="remote",
        host=other_server,
        api_key="k",
        model_key=hf_model_key("graft/tiny-llama"),
        retries=0,
        timeout_s=10,
    )
    rows = [GraftRow([1, 5, 6], {}, parse_spec("LT:0:ffn"))]
    with pytest.raises(RemoteError) as info:
        run_grafts(base, perturbed_copy(base), rows, executor=RemoteExecutor(cfg))
    assert info.value.kind == "protocol"
    assert "HTTP 404 on /subscribe" in str(info.value)
    assert "API key" not in str(info.value)
    assert server_versions(cfg, timeout_s=10) is None  # no /env there: nothing recorded


def test_an_error_while_the_server_deploys_the_model_is_a_model_error():
    from nnsight.intervention.backends.remote import RemoteError as NnsightRemoteError

    exc = NnsightRemoteError("Traceback ...\nValueError: no checkpoint for graft/x")
    key = hf_model_key("graft/x")
    running = classify(exc, host="http://h", model_key=key, where="request 1/1")
    assert running.kind == "server"
    exc.graft_stage = "DEPLOYING"  # the last status the server sent before the error
    err = classify(exc, host="http://h", model_key=key, where="request 1/1")
    assert err.kind == "model"
    assert f"could not deploy model key {key} (ValueError: no checkpoint" in str(err)


def test_row_metrics_are_the_logits_metrics_locally_and_through_the_remote_path():
    base = tiny_model("llama")
    donors = {"sft": perturbed_copy(base, seed=100)}
    rows = [
        GraftRow([1, 5, 6, 7, 8], {}, parse_spec("LT:h2:o,ffn")),
        GraftRow([1, 9, 10], {}, parse_spec("LT:all:all")),
    ]
    logprobs = run_grafts(base, donors, rows, log_probs=True)
    local = score_grafts(base, donors, rows, [5, 7], top_k=3)
    assert torch.allclose(local["target_logprob"], logprobs[[0, 1], [5, 7]])
    expected_rank = (logprobs > logprobs[[0, 1], [5, 7]].unsqueeze(1)).sum(1)
    assert torch.equal(local["target_rank"], expected_rank)
    assert torch.equal(local["top_ids"], logprobs.topk(3).indices)
    assert torch.allclose(local["top_logprobs"], logprobs.topk(3).values)
    simulate = RemoteExecutor(RemoteConfig(mode="simulate"))
    simulated = score_grafts(base, donors, rows, [5, 7], top_k=3, executor=simulate)
    # the remote path runs the one-pass trace body: bit-equal to the local one-pass path
    one_pass = score_grafts(
        base, donors, rows, [5, 7], top_k=3, executor=LocalExecutor(shortcuts=False)
    )
    for name, value in one_pass.items():
        assert torch.equal(simulated[name], value), name


@pytest.mark.parametrize(
    ("targets", "top_k", "message"),
    [
        ([5], 3, "one token id per row: 1 for 2 rows"),
        ([5, 10_000], 3, "token ids of the model, 0 to"),
        ([5, 7], 0, "top_k must be between 1 and the vocabulary size"),
    ],
)
def test_bad_targets_are_one_line_errors(targets, top_k, message):
    base = tiny_model("llama")
    rows = [GraftRow([1, 5, 6], {}, parse_spec("none"))] * 2
    with pytest.raises(SpecError, match=message):
        score_grafts(base, {}, rows, targets, top_k=top_k)


def test_the_default_payload_limit_fits_a_redis_value():
    """NDIF queues a request as one Redis value, capped at 512 MiB with the envelope."""
    assert RemoteConfig().max_payload_bytes == 448 * 1024 * 1024


class _EnvOnly(_NotNdif):
    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path != "/env":
            return self.send_error(404)
        body = json.dumps(
            {
                "python_version": "3.12.1 (main, Jan  1 2026) [GCC 12]",
                "packages": {
                    "ndif": "0.1.2",
                    "nnsight": "0.8.1",
                    "numpy": "2.0",
                    "torch": "2.13.0",
                },
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_server_versions_are_what_the_servers_env_says_and_only_for_remote_runs():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EnvOnly)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    host = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        versions = server_versions(RemoteConfig(mode="remote", host=host, api_key=""))
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert versions == {
        "host": host,
        "python": "3.12.1",
        "ndif": "0.1.2",
        "nnsight": "0.8.1",
        "torch": "2.13.0",
    }
    assert server_versions(RemoteConfig(mode="simulate")) is None
    assert server_versions(RemoteConfig()) is None
