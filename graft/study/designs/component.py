"""E3 as a design: component sets at the last token, for each donor pair (SFT -> PRE on
forward prompts; the reversal pair, both-direction -> one-direction model on reversed
prompts), each pair its own run, their summaries combined."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import polars as pl

from graft.core import parse_spec
from graft.errors import ExperimentError, SpecError
from graft.results.folder import RunFolder
from graft.study.designs.common import protocol_fields, specs_for
from graft.study.designs.design import Design, DesignRun
from graft.study.running.summaries import format_summary
from graft.study.specs.config import ModelSource
from graft.study.specs.grafts import check_layer_rule, component_grafts, protocol_notes
from graft.study.specs.protocol import Protocol
from graft.study.specs.request import RunRequest
from graft.study.specs.run import RunSpecs


@dataclass(frozen=True)
class DonorPair:
    """A donor -> base pair of E3.

    Args:
        base: the model the grafts run in.
        donor: the model they graft from (donor ``sft`` of the specs).
        directions: the test prompts' directions.
    """

    base: ModelSource
    donor: ModelSource
    directions: tuple[str, ...]


#: E3's pairs, by name.
PAIRS = ("sft", "reversal")


def donor_pairs(protocol: Protocol) -> dict[str, DonorPair]:
    """E3's pairs under ``protocol``: SFT is its donor variant (the both-direction model
    under the paper's: the paper's sft2pre donor; its both2one pair is graft's reversal
    pair)."""
    return {
        "sft": DonorPair(
            ModelSource("pretrained"), ModelSource(protocol.donor_variant), ("forward",)
        ),
        "reversal": DonorPair(ModelSource("one"), ModelSource("both"), ("reverse",)),
    }


def component(
    specs: RunSpecs,
    layers: str = "q4",
    pairs: Sequence[str] = PAIRS,
    split_qkv: bool = False,
    fe: str | None = None,
) -> Design:
    """E3: ATTN+O+FFN, ATTN+O, O+FFN, ATTN+FFN, O, FFN, O+FFN_up, O+FFN_down at the last token
    over the layer group ``layers``, for each pair of ``pairs``, PRE and SFT as references;
    ``split_qkv`` adds Q, K, V and Q+K alone; ``fe`` (components) grafts the first entity in
    every layer too. Each pair runs into ``<folder>/<pair>``; several pairs' summaries are
    combined in the folder itself.

    Raises:
        ExperimentError: an unknown pair, or none.
        SpecError: ``layers`` or ``fe`` that make no spec (or break the protocol's rule).
    """
    specs = specs_for(specs, "component")
    names = list(dict.fromkeys(pairs))
    unknown = [p for p in names if p not in PAIRS]
    if unknown or not names:
        raise ExperimentError(f"unknown pair(s) {unknown}; use {', '.join(PAIRS)}", param="pairs")
    if fe:
        try:
            parse_spec(f"FE:all:{fe}")
        except SpecError as err:
            raise SpecError(str(err), param="fe") from None
    try:
        check_layer_rule(layers, specs.protocol)
        planned = component_grafts(
            layers, specs.analysis.head_policy, split_qkv, fe=fe, protocol=specs.protocol
        )
    except SpecError as err:
        raise SpecError(str(err), param="layers") from None
    notes = protocol_notes(planned, specs.protocol)
    fields = protocol_fields(specs.protocol, "both")
    folder = specs.out_folder(fields.get("out_tag", ""))
    runs = {}
    for name in names:
        pair = donor_pairs(specs.protocol)[name]
        pair_specs = specs_for(
            specs, "component", out=str(folder / name), directions=pair.directions
        )
        runs[name] = RunRequest(
            specs=pair_specs,
            grafts=tuple(replace(g, group=name) for g in planned),
            base=pair.base,
            donors={"sft": pair.donor},
            extra_config={"protocol_notes": notes} if notes else {},
            **fields,
        )
    finish = _combine if len(runs) > 1 else None
    return Design("component", folder, runs, tuple(notes), finish)


def _combine(done: DesignRun) -> None:
    """The pairs' summaries in one table in the design's folder, with a config naming
    every pair's grafts."""
    folder = RunFolder(done.design.folder)
    folder.mark()
    combined = pl.concat([r.summary for r in done.runs.values()], how="diagonal_relaxed")
    folder.write_summary(combined)
    names = list(done.runs)
    configs = [r.folder.read_config() or {} for r in done.runs.values()]  # as finally stored
    grafts = [g for config in configs for g in config["grafts"]]
    folder.write_json("config.json", dict(configs[0], grafts=grafts, pairs=names))
    done.files["summary"] = folder.path / "summary.csv"
    done.lines += ["all pairs:", format_summary(combined)]
