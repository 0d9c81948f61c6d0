"""Fixtures of the study tests that run experiments: a small generated dataset and a fake
finetune of tiny-llama (module-scoped: one per test module)."""

from __future__ import annotations

from pathlib import Path

import pytest

from graft.models import tiny_tokenizer
from graft.models.tiny import perturbed_copy, tiny_model
from graft.study.data.datasets import DatasetConfig, generate_dataset
from graft.study.training.donors import accept_donor


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """Four facts per set (test_finetune overrides it with a larger one)."""
    return generate_dataset(DatasetConfig(n_facts=4), tmp_path_factory.mktemp("data") / "facts")


@pytest.fixture(scope="module")
def donor_path(tmp_path_factory) -> str:
    """A fake finetune of tiny-llama (same weights as load_model('tiny-llama'), perturbed),
    a folder a user brought: accepted as it is (graft-exp accept), as a donor must be."""
    folder = tmp_path_factory.mktemp("donor") / "tiny-llama-perturbed"
    perturbed_copy(tiny_model("llama", seed=0), seed=7).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    accept_donor(folder)
    return str(folder)
