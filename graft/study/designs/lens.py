"""The logit lens under grafts as a design: the SFT donor's run with the lens as its per-batch
analysis, then the lens's tables and figures."""

from __future__ import annotations

from collections.abc import Sequence

from graft.errors import ExperimentError
from graft.study.analyses.lens import LensAnalysis, LensRun, check_lens_config, draw_lens_figures
from graft.study.analyses.lens_tables import LENS_SUMMARY, LENS_TABLE, LENS_TOP_TOKENS
from graft.study.designs.common import graft_list, sft_design, specs_for
from graft.study.designs.design import Design, DesignRun
from graft.study.specs.choices import DEFAULT_TOP_K
from graft.study.specs.grafts import reference
from graft.study.specs.run import RunSpecs

#: The grafts of every lens run after PRE and SFT; each of ``graft_specs`` adds one.
LENS_SPECS = ("FE=FE:all:all", "LT=LT:all:all", "FE+LT=FE+LT:all:all")


def lens(
    specs: RunSpecs,
    graft_specs: Sequence[str] = (),
    top_k: int = DEFAULT_TOP_K,
    variant: str | None = None,
) -> Design:
    """The residual stream at LT and at FE's last token, at the embeddings and after every
    layer, decoded through each graft's final norm and unembedding, for PRE, SFT, FE, LT,
    FE+LT and each of ``graft_specs``; ``top_k`` tokens stored per prompt, graft, layer and
    position. One replicate, on this machine.

    Raises:
        ExperimentError: a remote run, or specs the lens cannot take (several replicates).
    """
    specs = specs_for(specs, "lens")
    if specs.execution.remote is not None:
        raise ExperimentError("the lens runs on this machine only; drop remote", param="remote")
    check_lens_config(specs)
    policy, protocol = specs.analysis.head_policy, specs.protocol
    grafts = [reference("PRE", None), reference("SFT", "sft")]
    grafts += graft_list((*LENS_SPECS, *graft_specs), policy, protocol)
    return sft_design(
        specs, grafts, variant, analyses=(LensAnalysis(top_k=top_k),), finish=_lens_tables
    )


def _lens_tables(done: DesignRun) -> None:
    run = done.run
    result: LensRun = run.analyses[LENS_TABLE]
    done.result = result
    done.files[LENS_SUMMARY] = run.folder.path / f"{LENS_SUMMARY}.csv"
    done.files[LENS_TOP_TOKENS] = run.folder.path / f"{LENS_TOP_TOKENS}.csv"
    done.lines += [
        f"lens: {len(result.computed)} batches computed",
        f"lens summary: {done.files[LENS_SUMMARY]}",
        f"lens top tokens: {done.files[LENS_TOP_TOKENS]}",
    ]
    done.figures += draw_lens_figures(run.folder.path)
