"""The lines of the logit lens identical by causality: from the specs alone, the grafts
whose lens at a read position is an earlier graft's (a graft whose cells at and before the
read position, and whose readout, are another's leaves that position's stream as the
other's: at ``FE-last``, ``LT`` grafts nothing before it and equals ``PRE``; ``FE+LT``
equals ``FE``); :func:`identical_lines` finds them for a run's ``same_as`` column."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from graft.core.families.arch import Architecture
from graft.core.planning.plan import GraftRow
from graft.errors import ExperimentError
from graft.study.analyses.lens_trace import POSITIONS, own_model
from graft.study.data.prompts import TestExample
from graft.study.data.rows import graft_rows
from graft.study.specs.grafts import NamedGraft


def read_position(row: GraftRow, position: str) -> int | None:
    """The prompt index (unpadded) the lens reads ``position`` at in ``row`` (``LT``: the
    last token; ``FE-last``: the first entity's last token), or None when it has none."""
    if position == "LT":
        return len(row.input_ids) - 1
    if position == "FE-last":
        fe = list(row.spans.get("FE", ()))
        return fe[-1] if fe else None
    raise ExperimentError(f"unknown lens position {position!r}; use one of {POSITIONS}")


def stream_key(row: GraftRow, arch: Architecture, position: str) -> Hashable | None:
    """What fixes the lens of ``row`` at ``position``, from its spec alone: two rows of one
    prompt with equal keys have the same stream there and the same readout, so the same lens.

    A causal model's state at position p depends on the tokens and weights at positions up to
    p only, so a graft's cells after p change nothing there: the key is the readout (whose
    final norm and unembedding) and the grafted cells at positions <= p (layer, component,
    position, donor). A whole donor with its own head (``SFT``) is that donor's run: its key
    is the donor's name. None when the row has no such position.
    """
    at = read_position(row, position)
    if at is None:
        return None
    owner = own_model(row.spec)
    if owner is not None:
        return ("own", owner)
    spans = {name: list(p) for name, p in row.spans.items()}
    resolved = row.spec.resolve(arch, len(row.input_ids), spans)
    cells = sorted(
        (layer, component, p, donor)
        for (layer, component), cell in resolved.cells.items()
        for p, donor in cell.items()
        if p <= at
    )
    return ("graft", resolved.final_norm_donor, resolved.unembed_donor, tuple(cells))


def identical_lines(
    examples: Sequence[TestExample],
    grafts: Sequence[NamedGraft],
    rows: Sequence[tuple[int, int]],
    arch: Architecture,
    positions: Sequence[str] = POSITIONS,
) -> dict[tuple[str, str, str, str], str]:
    """Grafts whose lens is an earlier graft's by causality: ``(group, template, graft,
    position) -> the earlier graft`` (run order, the first of equal ones) where, on every
    prompt of the template, the two rows' :func:`stream_key` at the position agree (and the
    two grafts run on the same prompts). Decided from the specs and prompts, never by name:
    at ``FE-last``, ``LT`` (cells at the last token only) is ``PRE`` and ``FE+LT`` is ``FE``;
    under ``head=donor`` ``LT`` reads out with the donor's head and is ``PRE`` no more.

    Args:
        examples: the run's examples.
        grafts: its grafts, in run order.
        rows: its rows, (example index, graft index) (:func:`graft.study.data.rows.plan_rows`).
        arch: the base's architecture.
        positions: the read positions.
    """
    keys: dict[tuple[str, str, int], list[tuple[str, Hashable]]] = {}
    for (ei, gi), row in zip(rows, graft_rows(examples, grafts, rows), strict=True):
        for position in positions:
            key = stream_key(row, arch, position)
            if key is not None:
                keys.setdefault((examples[ei].template, position, gi), []).append(
                    (examples[ei].prompt_id, key)
                )
    # per (template, position, graft): its keys in prompt order (a prompt id is one row)
    lines = {at: tuple(sorted(found, key=lambda k: k[0])) for at, found in keys.items()}
    same: dict[tuple[str, str, str, str], str] = {}
    for (template, position, gi), line in lines.items():
        graft = grafts[gi]
        for earlier in range(gi):
            other = grafts[earlier]
            if other.group == graft.group and lines.get((template, position, earlier)) == line:
                same[(graft.group, template, graft.name, position)] = other.name
                break
    return same
