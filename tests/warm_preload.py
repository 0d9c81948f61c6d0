"""What the warm fork server (tests/warm.py) imports once: every module of graft and of its
commands, and the upstream modules they import only when a command runs (transformers'
model code and Trainer, matplotlib's pyplot and PDF backend, faker's locale). Nothing here runs a torch
operation: a forked child must not inherit a thread pool."""

from __future__ import annotations

import contextlib
import importlib
import pkgutil

import graft
import graft_experiments


def _import_all(package) -> None:
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        # an optional extra that is not installed is imported when used, as in a cold start
        with contextlib.suppress(ImportError):
            importlib.import_module(info.name)


_import_all(graft)
_import_all(graft_experiments)

import faker  # noqa: E402
import fontTools.subset  # noqa: E402, F401  (matplotlib's PDF figures subset their fonts)
import matplotlib.backends.backend_pdf  # noqa: E402, F401
import matplotlib.pyplot  # noqa: E402, F401
import transformers.modeling_utils  # noqa: E402, F401
from transformers import (  # noqa: E402, F401
    Gemma2Config,
    Gemma3TextConfig,
    GemmaConfig,
    GPT2LMHeadModel,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen3Config,
    Trainer,
    TrainingArguments,
)

faker.Faker("en_US")
