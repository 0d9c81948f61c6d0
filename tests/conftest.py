"""Shared fixtures: one autouse fixture seeds everything; tiny model pairs are cached."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

# the two tiers: slow_except and the record of what the fast tier runs (tests/fast_tier.py)
pytest_plugins = ["tests.fast_tier"]

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# transformers' console handler binds the sys.stderr of the moment it is made: made first inside
# a CliRunner invoke (the commands import transformers lazily), it would write into that
# invoke's closed capture in every later test. Made here, it writes to the real stderr.
import transformers  # noqa: E402

transformers.logging.get_verbosity()

# pytest-xdist workers (scripts/test.sh runs the slow tier on two) share the cores: each gets
# its share of torch threads instead of all of them, which would oversubscribe the machine
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(
        max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    )


@pytest.fixture(autouse=True)
def _seed_everything():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield
    # global torch state a test (or a benchmark's main) must not leak into the next test
    assert torch.is_grad_enabled(), "this test left autograd disabled globally"


@pytest.fixture(scope="session")
def tiny_pairs():
    """``family -> (base, donor)`` tiny random model pairs, built once per session."""
    from graft.models.tiny import tiny_pair

    cache: dict = {}

    def get(family: str, **kwargs):
        key = (family, tuple(sorted(kwargs.items())))
        if key not in cache:
            cache[key] = tiny_pair(family, **kwargs)
        return cache[key]

    return get


@pytest.fixture(scope="module")
def one_thread():
    """Torch on one thread for a module: tiny models run faster so, and CI machines are shared
    (``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A workspace folder shared by a module's tests (datasets and donors are made once)."""
    return tmp_path_factory.mktemp("workspace")


def pytest_addoption(parser):
    parser.addoption(
        "--graft-device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="build every test's models and tensors on this device (default cpu); cuda runs "
        "the suite on a GPU in float32 without TF32, at the tests' own tolerances",
    )


@pytest.fixture(scope="session", autouse=True)
def _graft_device(request):
    """``--graft-device cuda``: torch's default device for the whole session (tiny models
    built from configs, the tensors tests make), TF32 off so float32 keeps its tolerances."""
    device = request.config.getoption("--graft-device")
    if device == "cpu":
        yield device
        return
    if not torch.cuda.is_available():
        pytest.exit("--graft-device cuda: this machine has no CUDA device; drop the option", 2)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_default_device(device)
    try:
        yield device
    finally:
        torch.set_default_device(None)
