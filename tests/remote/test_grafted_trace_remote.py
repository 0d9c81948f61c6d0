"""graft.trace on a server: the user's trace body and the graft travel as one request.

Against the NDIF wire-protocol double (``graft`` is unimportable while it deserialises, as
on a server without it) in both donor modes, and through nnsight's in-process simulation:
the saved values equal the same trace run here, bit for bit (float32, CPU).
"""

from __future__ import annotations

import pytest
import torch

from graft.core.api.grafted_trace import trace
from graft.errors import RemoteError
from graft.models import tiny_tokenizer
from graft.models.paper import meta_model
from graft.models.tiny import perturbed_copy, tiny_config, tiny_model
from graft.remote.config import RemoteConfig
from graft.remote.executor import RemoteExecutor
from graft.remote.hosted import hosted_model_key

from .test_remote import API_KEY, BASE_KEY, remote_cfg

try:
    from tests.ndif_double import NdifDouble
except ImportError:  # tests/ is not a package: conftest puts it on sys.path
    from ndif_double import NdifDouble

pytestmark = pytest.mark.usefixtures("one_thread")

PAIR_KEY = hosted_model_key("graft.tiny:llama", {"sft": "graft.tiny:llama:donor"})
TEXTS = ["Keanu Reeves starred in a movie with", "Tom Hanks acted in"]
FIELDS = [{"FE": "Keanu Reeves"}, {"FE": "Tom Hanks"}]
SPEC = "FE+LT:all:all"
LAYER = "model.layers.1"
MLP = "model.layers.2.mlp"


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def llama():
    """The client's tiny llama pair, as graft.remote.hosted's tiny sources build it."""
    base = tiny_model("llama")
    return base, perturbed_copy(base, seed=100)


@pytest.fixture(scope="module")
def server(tok):
    import aiohttp  # noqa: F401  (the dev extra installs it: an ImportError is a broken install)
    from nnsight.modeling.transformers import TransformersModel

    models = {BASE_KEY: TransformersModel(tiny_model("llama"), tokenizer=tok), PAIR_KEY: None}
    with NdifDouble(models, api_keys={API_KEY}) as double:
        yield double


def run(base, donors, tok, executor=None) -> dict[str, torch.Tensor]:
    """A layer's output, a write to a grafted MLP and the logits, in one grafted trace."""
    with trace(base, donors, tok, TEXTS, SPEC, fields=FIELDS, executor=executor) as g:
        hidden = g.model.get(LAYER).output.save()
        g.model.get(MLP).output[:, -1] = 0
        logits = g.logits.save()
    return {"hidden": hidden, "logits": logits}


def cfg(server, **kwargs) -> RemoteConfig:
    """test_remote's settings for the double, with no retries."""
    return remote_cfg(server, **{"retries": 0, **kwargs})


def assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert torch.equal(got[name], value), name


def test_ship_mode_equals_the_local_trace(server, llama, tok):
    base, donor = llama
    local = run(base, {"sft": donor}, tok)
    n_before = len(server.requests)
    remote = run(base, {"sft": donor}, tok, RemoteExecutor(cfg(server)))
    assert_same(remote, local)
    (record,) = server.requests[n_before:]
    assert record.outcome == "completed" and record.model_key == BASE_KEY


@pytest.mark.slow
def test_hosted_mode_equals_the_local_trace_with_a_weightless_client(server, llama, tok):
    base, donor = llama
    local = run(base, {"sft": donor}, tok)
    client = meta_model(tiny_config("llama"))  # no weights on the client at all
    executor = RemoteExecutor(cfg(server, donor_mode="hosted", model_key=PAIR_KEY))
    n_before = len(server.requests)
    remote = run(client, ["sft"], tok, executor)
    assert_same(remote, local)
    (record,) = server.requests[n_before:]
    assert record.outcome == "completed" and record.payload_bytes < 20_000  # ids only


def test_the_simulated_path_equals_the_local_trace(llama, tok):
    base, donor = llama
    simulate = RemoteExecutor(RemoteConfig(mode="simulate"))
    assert_same(run(base, {"sft": donor}, tok, simulate), run(base, {"sft": donor}, tok))


def test_a_failed_request_is_one_remote_error_line(server, llama, tok):
    base, donor = llama
    with pytest.raises(RemoteError) as info:
        run(base, {"sft": donor}, tok, RemoteExecutor(cfg(server, api_key="wrong")))
    assert info.value.kind == "auth" and "\n" not in str(info.value)
    assert "rejected the API key" in str(info.value)


def test_ship_mode_needs_the_donor_weights(server, llama, tok):
    base, _ = llama
    with pytest.raises(RemoteError, match="ship mode sends donor 'sft'"):
        trace(base, ["sft"], tok, TEXTS, SPEC, fields=FIELDS, executor=RemoteExecutor(cfg(server)))


def test_a_trace_over_the_payload_limit_is_refused_before_sending(server, llama, tok):
    base, donor = llama
    n_before = len(server.requests)
    with pytest.raises(RemoteError, match="would send .* of donor weights") as info:
        run(base, {"sft": donor}, tok, RemoteExecutor(cfg(server, max_payload_mb=0.05)))
    assert info.value.kind == "payload" and len(server.requests) == n_before
