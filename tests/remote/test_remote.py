"""Remote execution: nnsight's real RemoteBackend against an NDIF wire-protocol double.

Both donor modes must reproduce the local engine (exactly, in float32 on the CPU), every
failure must come back as one readable line, and every kind of trace the experiments use
must survive nnsight's serialise / deserialise path (``remote="local"``).
"""

from __future__ import annotations

import copy
import http.server
import json
import logging
import socket
import threading

import pytest
import torch

from graft.core.execution.engine import LocalExecutor, run_grafts
from graft.core.families.arch import architecture_of
from graft.core.planning.plan import GraftRow, plan_batch
from graft.errors import RemoteError
from graft.models.paper import PAPER_CONFIGS, meta_model
from graft.models.tiny import perturbed_copy, tiny_config, tiny_model
from graft.remote.config import RemoteConfig, hf_model_key
from graft.remote.executor import RemoteExecutor
from graft.remote.hosted import (
    DONORS_ATTR,
    GraftPairModel,
    donor_module_id,
    hosted_model_key,
    parse_hosted_model_key,
)
from graft.remote.payload import estimate_payload_bytes, format_bytes, payload_table
from tests.engine_cases import random_rows

try:
    from tests.ndif_double import NdifDouble
except ImportError:  # tests/ is not a package: conftest puts it on sys.path
    from ndif_double import NdifDouble

API_KEY = "test-key"
BASE_KEY = hf_model_key("graft/tiny-llama")
BF16_KEY = hf_model_key("graft/tiny-llama-bf16")
OTHER_KEY = hf_model_key("graft/tiny-llama-narrow-mlp")
PAIR_KEY = hosted_model_key(
    "graft.tiny:llama",
    {"sft": "graft.tiny:llama:donor", "relation": "graft.tiny:llama:donor=7"},
)
POSITION = "FE+LT:all:all"
#: Remote executors run the one-pass trace body; the local shortcuts (carriers, shared
#: prefixes, split modules) agree with it only to rounding, so bit-equality is checked
#: against the local one-pass path.
EXACT_LOCAL = LocalExecutor(shortcuts=False)
COMPONENT = "LT:h2:o,ffn"
HYBRID = "FE:all:all@sft; LT:h2:o,ffn@relation"


def make_rows(specs, n_prompts: int = 3, seed: int = 0) -> list[GraftRow]:
    lengths = [(6, 9, 11)[i % 3] for i in range(n_prompts)]  # several lengths: padded batches
    return random_rows(specs, lengths, {"FE": [1, 2], "M": [4, 5]}, seed)


@pytest.fixture(scope="module")
def llama():
    """The client's tiny llama pair (plus a second donor), as graft.remote.hosted's tiny sources build it."""
    base = tiny_model("llama")
    return base, {"sft": perturbed_copy(base, seed=100), "relation": perturbed_copy(base, seed=7)}


@pytest.fixture(scope="module")
def server():
    import aiohttp  # noqa: F401  (the dev extra installs it: an ImportError is a broken install)
    from nnsight.modeling.transformers import TransformersModel

    from graft.models import tiny_tokenizer

    tok = tiny_tokenizer()
    narrow = tiny_config("llama")
    narrow.intermediate_size = 48  # the key names a model whose MLP differs from the client's
    import transformers

    models = {
        # the server's own copies: nothing is shared with the client's objects
        BASE_KEY: TransformersModel(tiny_model("llama"), tokenizer=tok),
        BF16_KEY: TransformersModel(tiny_model("llama").to(torch.bfloat16), tokenizer=tok),
        OTHER_KEY: TransformersModel(
            transformers.AutoModelForCausalLM.from_config(narrow).eval(), tokenizer=tok
        ),
        PAIR_KEY: None,  # built from its key on first use, as NDIF deploys a model
    }
    with NdifDouble(models, api_keys={API_KEY}) as double:
        yield double


def remote_cfg(server, **kwargs) -> RemoteConfig:
    values = dict(
        mode="remote",
        host=server.url,
        api_key=API_KEY,
        model_key=BASE_KEY,
        retries=1,
        retry_wait_s=0.0,
        timeout_s=60,
    )
    values.update(kwargs)
    return RemoteConfig(**values)


# ------------------------------------------------------------------ the wire protocol


@pytest.mark.parametrize("spec", [POSITION, COMPONENT])
def test_ship_mode_equals_local(server, llama, spec):
    base, donors = llama
    rows = make_rows([spec, "none"], n_prompts=3)
    local = run_grafts(base, donors["sft"], rows, batch_size=4, executor=EXACT_LOCAL)
    n_before = len(server.requests)
    cfg = remote_cfg(server, rows_per_request=4)  # 6 rows -> 2 requests of 1 batch each
    remote = run_grafts(base, donors["sft"], rows, batch_size=4, executor=RemoteExecutor(cfg))
    assert torch.equal(remote, local)
    seen = server.requests[n_before:]
    assert [r.outcome for r in seen] == ["completed", "completed"]
    assert all(r.model_key == BASE_KEY and r.compress for r in seen)
    assert all(r.headers.get("ndif-api-key") == API_KEY for r in seen)
    assert seen[0].env.get("attn_implementation") == base.config._attn_implementation


def test_hosted_mode_equals_local_with_a_weightless_client(server, llama, caplog):
    base, donors = llama
    rows = make_rows([POSITION, COMPONENT, HYBRID], n_prompts=3)
    local = run_grafts(base, donors, rows, batch_size=4, executor=EXACT_LOCAL)
    client_base = meta_model(tiny_config("llama"))  # no weights on the client at all
    cfg = remote_cfg(server, donor_mode="hosted", model_key=PAIR_KEY)
    n_before = len(server.requests)
    with caplog.at_level(logging.INFO, logger="graft.remote"):
        remote = run_grafts(
            client_base, ["sft", "relation"], rows, batch_size=4, executor=RemoteExecutor(cfg)
        )
    assert torch.equal(remote, local)
    (record,) = server.requests[n_before:]  # 9 rows, 3 batches: one request
    assert record.model_key == PAIR_KEY and record.outcome == "completed"
    assert record.payload_bytes < 20_000  # ids only, no donor weights
    assert "hosted donors (ids only)" in caplog.text


def test_ship_mode_logs_the_payload_and_results_may_come_on_the_socket(server, llama, caplog):
    base, donors = llama
    rows = make_rows([HYBRID], n_prompts=2)
    local = run_grafts(base, donors, rows, batch_size=2, executor=EXACT_LOCAL)
    server.result_on_socket = True
    try:
        with caplog.at_level(logging.INFO, logger="graft.remote"):
            executor = RemoteExecutor(remote_cfg(server))
            remote = run_grafts(base, donors, rows, batch_size=2, executor=executor)
    finally:
        server.result_on_socket = False
    assert torch.equal(remote, local)
    expected = estimate_payload_bytes(base, HYBRID)  # both donors' modules
    err = caplog.text
    assert "request 1/1: 2 rows in 1 batches; donor weights" in err
    assert format_bytes(expected) in err


def test_a_bfloat16_server_runs_shipped_float32_donors_in_its_dtype(server, llama):
    base, donors = llama
    rows = make_rows([COMPONENT, "LT:all:all"], n_prompts=2)
    base16 = copy.deepcopy(base).to(torch.bfloat16)
    donor16 = copy.deepcopy(donors["sft"]).to(torch.bfloat16)
    local16 = run_grafts(base16, donor16, rows, batch_size=4, executor=EXACT_LOCAL)
    cfg = remote_cfg(server, model_key=BF16_KEY, compress=False)
    remote = run_grafts(base, donors["sft"], rows, batch_size=4, executor=RemoteExecutor(cfg))
    assert torch.equal(remote, local16)


def test_right_padding_and_one_planned_batch(server, llama):
    base, donors = llama
    rows = make_rows([COMPONENT, POSITION], 2)
    kw = dict(batch_size=8, padding_side="right", sort_by_length=False)
    local = run_grafts(base, donors["sft"], rows, **kw, executor=EXACT_LOCAL)
    executor = RemoteExecutor(remote_cfg(server))
    assert torch.equal(run_grafts(base, donors["sft"], rows, executor=executor, **kw), local)
    plan = plan_batch(architecture_of(base), rows, pad_id=0, padding_side="left")
    (one,) = executor.run(base, {"sft": donors["sft"]}, [plan])
    assert torch.equal(one, EXACT_LOCAL.run_plan(base, {"sft": donors["sft"]}, plan))


def test_a_transient_failure_is_retried(server, llama):
    base, donors = llama
    rows = make_rows([COMPONENT], n_prompts=1)
    server.transient_failures = 1
    out = run_grafts(base, donors["sft"], rows, executor=RemoteExecutor(remote_cfg(server)))
    assert server.transient_failures == 0
    assert torch.equal(out, run_grafts(base, donors["sft"], rows, executor=EXACT_LOCAL))


# ------------------------------------------------------------------------- failures


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("kind", "overrides", "message"),
    [
        (
            "unreachable",
            {"host": "http://127.0.0.1:{port}"},
            "cannot reach the NDIF host http://127.0.0.1:{port} (Connection refused); check "
            "host (or env NDIF_HOST) and that the server is running (gave up after 2 attempts)",
        ),
        (
            "auth",
            {"api_key": "wrong"},
            "rejected the API key (HTTP 401: Invalid or missing API key.); set NDIF_API_KEY",
        ),
        (
            "model",
            {"model_key": hf_model_key("someone/else")},
            "is not deployed on this server.); check model_key",
        ),
        (
            "payload",
            {"max_payload_mb": 0.05},
            "a request of at most 51.20 KB has no room for donor weights beside the trace and "
            "the residual stream of 2 rows (66.90 KB): raise max_payload_mb, lower batch_size, "
            "or use donor_mode='hosted'",
        ),
        (
            "server",
            {"model_key": OTHER_KEY},
            "the server failed while running request 1/1: RuntimeError: shape mismatch",
        ),
        (
            "transient",
            {"retries": 0, "_transient": 1},
            "request 1/1 to {host} failed: HTTP 503: Service temporarily unavailable.",
        ),
    ],
)
def test_failures_are_one_readable_line(server, llama, kind, overrides, message):
    base, donors = llama
    rows = make_rows([POSITION], n_prompts=2)
    port = _free_port()
    overrides = {
        k: v.replace("{port}", str(port)) if isinstance(v, str) else v for k, v in overrides.items()
    }
    server.transient_failures = overrides.pop("_transient", 0)
    try:
        with pytest.raises(RemoteError) as info:
            run_grafts(
                base, donors["sft"], rows, executor=RemoteExecutor(remote_cfg(server, **overrides))
            )
    finally:
        server.transient_failures = 0
    err = info.value
    assert err.kind == kind
    assert "\n" not in str(err)
    assert message.replace("{port}", str(port)).replace("{host}", server.url) in str(err)
    if kind == "server":  # the server's whole traceback is kept
        assert "Traceback" in err.detail


def test_the_server_refusing_a_large_request_is_a_payload_error(server, llama):
    base, donors = llama
    server.max_request_bytes = 10_000
    try:
        with pytest.raises(
            RemoteError, match=r"refused request 1/1 as too large \(HTTP 413"
        ) as info:
            run_grafts(
                base,
                donors["sft"],
                make_rows([POSITION], 1),
                executor=RemoteExecutor(remote_cfg(server)),
            )
    finally:
        server.max_request_bytes = None
    assert info.value.kind == "payload"


def test_a_key_for_another_model_is_named(server, llama):
    base, donors = llama
    deep = tiny_model("llama", n_layers=6)  # the client has layers the served model lacks
    with pytest.raises(
        RemoteError, match=r"has no module Module:model\.model\.layers\.[45]"
    ) as info:
        run_grafts(
            deep,
            perturbed_copy(deep),
            make_rows(["LT:-1:o"], 1),
            executor=RemoteExecutor(remote_cfg(server)),
        )
    assert info.value.kind == "model"


def test_ship_mode_needs_the_donor_weights_and_hosted_mode_a_key():
    base = tiny_model("llama")
    with pytest.raises(RemoteError, match="ship mode sends donor 'sft'"):
        run_grafts(
            base,
            ["sft"],
            make_rows([COMPONENT], 1),
            executor=RemoteExecutor(RemoteConfig(mode="remote")),
        )
    base.config._name_or_path = "meta-llama/Llama-3.2-1B"
    assert RemoteConfig(mode="remote").resolved_model_key(base) == hf_model_key(
        "meta-llama/Llama-3.2-1B"
    )
    hosted = RemoteConfig(mode="remote", donor_mode="hosted", hosted_donors={"sft": "/m/sft"})
    assert hosted.resolved_model_key(base) == hosted_model_key(
        "meta-llama/Llama-3.2-1B", {"sft": "/m/sft"}
    )
    with pytest.raises(RemoteError, match="hosted mode needs the graft pair's model key"):
        RemoteConfig(mode="remote", donor_mode="hosted").resolved_model_key(base)
    base.config._name_or_path = "/home/me/checkpoints/sft"
    with pytest.raises(RemoteError, match=r"not a hub id\): set model_key"):
        RemoteConfig(mode="remote").resolved_model_key(base)


# ------------------------------------------------- remote-safety of every trace kind


SIMULATED = {
    "llama": [POSITION, "(FE+LT)^C:all:all", COMPONENT, "LT:h2:attn", "ALL:all:q; head=donor"],
    "gpt2": [POSITION, "LT:q4:o,ffn", "LT:h2:q", "FE:all:k,v", "LT:all:embed; head=paper"],
    "gpt_neox": [POSITION, "LT:h2:v", "FE:all:q,k"],
    "gemma3": [POSITION, "LT:h2:q_norm,k_norm,o", "ALL:all:norms"],
}


@pytest.mark.parametrize("family", list(SIMULATED))
def test_every_trace_kind_survives_nnsight_serialisation(tiny_pairs, family):
    base, sft = tiny_pairs(family, tied=True if family == "gpt2" else None)
    donors = {"sft": sft, "relation": perturbed_copy(base, seed=7)}
    rows = make_rows([*SIMULATED[family], HYBRID, "FE:all:all@relation; head=donor@sft"], 2)
    local = run_grafts(base, donors, rows, batch_size=5, executor=EXACT_LOCAL)
    # the session requests a remote executor sends, serialised and run in-process
    cfg = RemoteConfig(mode="simulate", rows_per_request=6)
    assert torch.equal(
        run_grafts(base, donors, rows, batch_size=5, executor=RemoteExecutor(cfg)), local
    )


def test_hosted_pair_trace_survives_serialisation(llama):
    base, donors = llama
    rows = make_rows([POSITION, HYBRID, "ALL:all:all; head=donor@relation"], 2)
    local = run_grafts(base, donors, rows, batch_size=4, executor=EXACT_LOCAL)
    pair = GraftPairModel(
        copy.deepcopy(base), donors={k: copy.deepcopy(v) for k, v in donors.items()}
    )
    cfg = RemoteConfig(mode="simulate", donor_mode="hosted")
    assert torch.equal(
        run_grafts(pair, ["sft", "relation"], rows, batch_size=4, executor=RemoteExecutor(cfg)),
        local,
    )


def test_stale_persistent_ids_on_a_donor_do_not_redirect_it_to_the_base(server, llama):
    base, donors = llama
    donor = copy.deepcopy(donors["sft"])
    rows = make_rows([COMPONENT], 2)
    simulate = RemoteExecutor(RemoteConfig(mode="simulate"))
    run_grafts(donor, base, rows, executor=simulate)  # tags the donor's modules as a traced base
    assert "_persistent_id" in donor.model.layers[3].mlp.down_proj.__dict__
    # without stripping the tags the server would run ITS base modules at those paths
    out = run_grafts(base, donor, rows, executor=RemoteExecutor(remote_cfg(server)))
    assert torch.equal(out, run_grafts(base, donors["sft"], rows, executor=EXACT_LOCAL))


# --------------------------------------------------------------- keys, sizes, options


def test_hosted_model_key_format_and_round_trip():
    key = hosted_model_key("meta-llama/Llama-3.2-1B", {"sft": "/models/sft", "a": "x/y@v1"})
    assert key == (
        'graft.remote.hosted.GraftPairModel:{"base": "meta-llama/Llama-3.2-1B", '
        '"donors": {"a": "x/y@v1", "sft": "/models/sft"}}'
    )
    assert parse_hosted_model_key(key) == (
        "meta-llama/Llama-3.2-1B",
        {"a": "x/y@v1", "sft": "/models/sft"},
    )
    from nnsight.modeling.mixins.remotable import Remotable

    tiny = hosted_model_key("graft.tiny:llama", {"sft": "graft.tiny:llama:donor"})
    pair = Remotable.from_model_key(tiny)  # meta build: no weights
    assert isinstance(pair, GraftPairModel) and pair.to_model_key() == tiny
    inner = pair._module
    assert hasattr(getattr(inner, DONORS_ATTR), "sft")
    assert donor_module_id("sft", "model.layers.0.mlp") in pair._remoteable_persistent_objects()
    assert json.loads(hf_model_key("openai-community/gpt2-xl").split(":", 1)[1]) == {
        "repo_id": "openai-community/gpt2-xl",
        "revision": None,
        "task": "text-generation",
    }


def test_estimate_payload_bytes_counts_exactly_the_grafted_modules():
    base = tiny_model("llama")
    o = base.model.layers[3].self_attn.o_proj.weight.numel() * 4
    assert estimate_payload_bytes(base, "LT:-1:o") == o
    assert estimate_payload_bytes(base, ["LT:-1:o", "FE:-1:o"]) == o
    assert estimate_payload_bytes(base, "LT:-1:o; FE:-1:o@task") == 2 * o
    assert estimate_payload_bytes(base, "LT:-1:o", dtype=torch.bfloat16) == o // 2
    everything = sum(p.numel() * 4 for p in base.parameters())
    head = sum(p.numel() * 4 for p in (*base.model.norm.parameters(), *base.lm_head.parameters()))
    assert estimate_payload_bytes(base, "LT:all:all") == everything - head
    assert estimate_payload_bytes(base, "LT:all:all; head=donor") == everything


def test_payload_estimate_resolves_layers_and_all_under_the_specs_protocol():
    """The estimate once took graft's layer rule and graft's 'all' for every spec, so a
    paper-protocol run's payload was sized on other layers than the run grafted."""
    base = tiny_model("llama", n_layers=6)  # graft's q4 = layers 4-5, the paper's 3-5
    o = base.model.layers[0].self_attn.o_proj.weight.numel() * 4
    assert estimate_payload_bytes(base, "LT:q4:o") == 2 * o
    assert estimate_payload_bytes(base, "LT:q4:o; protocol=paper") == 3 * o
    assert estimate_payload_bytes(base, "LT:q2:o; protocol=paper") == o  # graft: layers 1-2
    gpt2 = tiny_model("gpt2")
    wpe = gpt2.transformer.wpe.weight.numel() * 4
    ours, paper = (estimate_payload_bytes(gpt2, f"FE:all:all{p}") for p in ("", "; protocol=paper"))
    assert ours - paper == wpe


def test_payload_of_paper_models_from_their_configs_alone():
    table = {(r["model"], r["graft"]): r for r in payload_table()}
    gpt2 = table[("gpt2-xl", "LT:all:all")]
    # every weight but the final norm (wte is the tied unembedding): 1,557,611,200 params
    assert gpt2["bytes_float32"] == (1_557_611_200 - 2 * 1600) * 4
    llama = table[("llama3.2-1b", "LT:all:all")]
    assert llama["bytes_bfloat16"] == (1_235_814_400 - 2048) * 2
    assert table[("llama3.2-1b", "ALL:all:q")]["bytes_bfloat16"] == 16 * 2048 * 2048 * 2
    assert set(PAPER_CONFIGS) == {r["model"] for r in table.values()}


def test_the_runner_runs_rows_on_the_executor_its_remote_config_names(llama, caplog):
    from types import SimpleNamespace

    from graft.models import tiny_tokenizer
    from graft.study.running import batches
    from graft.study.specs.config import ExperimentConfig
    from graft.study.specs.run import resolve

    base, donors = llama
    rows = make_rows([COMPONENT, POSITION], 2)
    targets = [3, 7, 11, 19]
    loaded = SimpleNamespace(model=base, tokenizer=tiny_tokenizer())
    with caplog.at_level(logging.INFO, logger="graft.remote"):
        local = batches._row_metrics(
            resolve(ExperimentConfig(experiment="t", remote=None)), loaded, donors, rows, targets
        )
        also_local = batches._row_metrics(
            resolve(ExperimentConfig(experiment="t", remote=RemoteConfig())),
            loaded,
            donors,
            rows,
            targets,
        )
        assert "request" not in caplog.text
        simulate = resolve(ExperimentConfig(experiment="t", remote=RemoteConfig(mode="simulate")))
        simulated = batches._row_metrics(simulate, loaded, donors, rows, targets)
    assert "request 1/1: 4 rows in 1 batches" in caplog.text
    assert also_local.equals(local)
    # remotely only the per-row metrics come back (the top REMOTE_TOP_K tokens of a row),
    # and they give the same examples table as the logits do locally
    from_logits, from_server = local, simulated
    assert from_server["top10_ids"].list.len().to_list() == [batches.REMOTE_TOP_K] * 4
    assert from_server.columns == from_logits.columns
    floats = ["target_prob", "target_logprob", "top10_probs"]
    assert from_server.drop(floats).equals(from_logits.drop(floats))  # ranks, hits, top ids
    for column in floats:
        a = torch.tensor(from_logits[column].to_list())
        b = torch.tensor(from_server[column].to_list())
        assert (a - b).abs().max().item() <= 1e-5, column


# ------------------------------------------------------------- a server that is no NDIF


class _Garbage(http.server.BaseHTTPRequestHandler):
    """Answers every request with HTTP 200 and a web page, as a plain web server does."""

    def _answer(self) -> None:
        body = b"<html>hello</html>"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:  # keep the test output quiet
        pass


@pytest.fixture(scope="module")
def garbage_server():
    """The URL of a local web server that answers HTTP 200 with a page to everything."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Garbage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


def test_a_server_answering_200_with_garbage_is_no_ndif_server(garbage_server, llama):
    base, donors = llama
    cfg = RemoteConfig(
        mode="remote", host=garbage_server, model_key=BASE_KEY, retries=0, timeout_s=10
    )
    with pytest.raises(RemoteError) as info:
        run_grafts(base, donors["sft"], make_rows([POSITION], 1), executor=RemoteExecutor(cfg))
    err = info.value
    assert err.kind == "protocol" and err.param == "host" and "\n" not in str(err)
    assert "HTTP 200: the reply is not an NDIF response" in str(err)
    assert "check that host (or env NDIF_HOST) points at an NDIF server" in str(err)


@pytest.mark.parametrize(
    ("frame", "what"),
    [("not json", "'not json'"), ('{"id": 1}', "'{\"id\": 1}'"), ("[1]", "'[1]'")],
)
def test_a_first_websocket_frame_without_a_session_is_no_ndif_response(frame, what):
    from graft.remote.backends import _session_id

    with pytest.raises(RemoteError, match="not an NDIF response") as info:
        _session_id(frame, "http://h:1")
    assert info.value.kind == "protocol" and what in str(info.value)
    assert _session_id('{"session_id": "s1"}', "http://h:1") == "s1"


def test_a_reply_nnsight_cannot_read_is_no_ndif_response():
    from nnsight.schema.response import ResponseModel

    from graft.remote.client import classify

    try:
        ResponseModel.model_validate_json("<html>hello</html>")
    except ValueError as exc:
        err = classify(exc, host="http://h:1", model_key="k", where="request 1/1")
    assert err.kind == "protocol" and "\n" not in str(err)
    assert "http://h:1 answered request 1/1 with a reply nnsight cannot read" in str(err)
    assert "not an NDIF response" in str(err)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_payload_mb", float("inf"), "max_payload_mb must be a finite number"),
        ("max_payload_mb", float("nan"), "max_payload_mb must be a finite number"),
        ("max_payload_mb", 0, "max_payload_mb must be positive, got 0"),
        ("max_payload_mb", 1e6, "max_payload_mb must be at most 65536"),
        ("timeout_s", float("inf"), "timeout_s must be a finite number"),
        ("timeout_s", 1e9, "timeout_s must be at most 604800"),
        ("retries", 1000, "retries must be at most 10"),
        ("retries", 1.5, "retries must be a whole number"),
        ("retry_wait_s", float("nan"), "retry_wait_s must be a finite number"),
        ("rows_per_request", 0, "rows_per_request must be at least 1"),
    ],
)
def test_remote_numbers_out_of_range_name_the_field(field, value, message):
    with pytest.raises(RemoteError, match=message) as info:
        RemoteConfig(mode="remote", **{field: value})
    assert info.value.kind == "config" and info.value.param == field
