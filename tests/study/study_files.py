"""The study files the study tests share: 2 tiny models x 2 finetune seeds x position,
component (the sft pair) and necessity, every run tiny (one prompt of one template, 4 facts,
1-step cpu finetunes, 10 bootstrap resamples, no progress bars)."""

from __future__ import annotations

from pathlib import Path

TINY_OPTIONS = """
[options]
n = 1
n_facts = 4
finetune_max_steps = 1
n_boot = 10
preset = "cpu"
device = "cpu"
templates = ["headline"]
batch_size = 8
progress = false
"""

TINY_STUDY = (
    """
models = ["tiny-llama", "tiny-gpt2"]
finetune_seeds = [0, 1]
workspace = "ws"
out = "runs"
"""
    + TINY_OPTIONS
    + """
[experiments.position]
positions = ["FE", "LT"]

[experiments.component]
pairs = ["sft"]

[experiments.necessity]
positions = ["FE", "LT"]
"""
)


def write_study(folder: Path, text: str = TINY_STUDY, name: str = "study.toml") -> Path:
    """``text`` as ``<folder>/<name>``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def tree(root: Path) -> list[str]:
    """Every path under ``root``, relative, sorted."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))
