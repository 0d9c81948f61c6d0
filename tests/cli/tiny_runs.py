"""The options of a tiny run that the command tests share: a tiny model, a few facts,
2-step finetunes, a few prompts per template, few bootstrap resamples, no progress bars."""

from __future__ import annotations

from pathlib import Path


def tiny_args(
    workspace: Path | str | None = None,
    *,
    model: str = "tiny-llama",
    n_facts: int = 10,
    n: int = 2,
    n_boot: int = 50,
    templates: str | None = None,
    out: Path | str | None = None,
    quiet: bool = True,
) -> list[str]:
    """``--model MODEL [--workspace W] --n-facts .. --finetune-max-steps 2 --n .. --n-boot ..
    [--templates T] [--out O] [--quiet]``."""
    args = ["--model", str(model)]
    if workspace is not None:
        args += ["--workspace", str(workspace)]
    args += ["--n-facts", str(n_facts), "--finetune-max-steps", "2", "--n", str(n)]
    args += ["--n-boot", str(n_boot)]
    if templates:
        args += ["--templates", templates]
    if out is not None:
        args += ["--out", str(out)]
    return args + (["--quiet"] if quiet else [])
