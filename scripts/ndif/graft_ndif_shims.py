"""CPU shims for running the real ``ndif`` server (0.1.x) on a machine without a GPU.

Imported by the Ray worker processes of the test harness (``scripts/ndif/harness.py`` puts
this folder on their ``PYTHONPATH``); nothing here patches the ``ndif`` package itself.

The stock model actor loads weights onto the GPUs the controller assigned and calls CUDA
when it loads and after every request. These subclasses replace exactly those two steps
(:meth:`load_from_disk`, :meth:`cleanup`) with CPU equivalents; request handling, the
trusted in-process path, the sandbox runner path, result packing and error reporting are
the package's own code. The controller still believes it places the replica on a GPU: the
harness starts Ray with one logical ``GPU`` and a ``cuda_memory_bytes`` resource.
"""

from __future__ import annotations

import gc
from typing import Any

import ray
from ndif.services.ray.deployments.modeling.base import BaseModelDeployment
from ndif.services.ray.sandbox.model import SandboxModelDeployment
from nnsight.modeling.mixins.remotable import Remotable

# Warm sandbox runners kept per actor. Each request consumes one and a refill spawns the
# next (python + torch + nnsight import: several seconds on a small CPU); the runner pool
# gives up after 30 s, so two warm runners keep back-to-back requests from waiting on it.
SANDBOX_POOL_SIZE = 2


class _CPUModel:
    """Replaces the GPU-only load and cleanup steps of an ndif model actor."""

    def load_from_disk(self) -> Any:
        # self.kwargs: what the controller passed beyond the placement (trust_remote_code)
        model = Remotable.from_model_key(
            self.model_key, dispatch=True, dtype=self.dtype_name, **self.kwargs
        )
        model._module.requires_grad_(False)
        return model

    def cleanup(self) -> None:
        self.kill_switch.clear()
        self.kill_reason = None
        self.execution_ident = None
        self.model.interleaver.cancel()
        gc.collect()


class CPUModelDeployment(_CPUModel, BaseModelDeployment):
    """The stock in-process model actor, on the CPU."""


class CPUSandboxModelDeployment(_CPUModel, SandboxModelDeployment):
    """The stock sandboxing model actor (untrusted requests run in a runner process), on CPU."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("pool_size", SANDBOX_POOL_SIZE)
        super().__init__(*args, **kwargs)

    def cleanup(self) -> None:
        self.discard_sandbox()  # the sandbox actor's own per-request step, then the CPU reset
        _CPUModel.cleanup(self)


@ray.remote(num_cpus=1, max_restarts=0)
class CPUModelActor(CPUModelDeployment):
    """Ray actor for :class:`CPUModelDeployment`."""


@ray.remote(num_cpus=1, max_restarts=0)
class CPUSandboxModelActor(CPUSandboxModelDeployment):
    """Ray actor for :class:`CPUSandboxModelDeployment`."""
