"""The engine's self-check on a base and donor pair (``graft-exp smoke`` runs it on the tiny
random pairs of :mod:`graft.models.tiny`): grafting nothing gives the base's own logits and
grafting everything with the donor's head the donor's; how far each graft moves the logits;
the engine's path."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from graft.core.execution.engine import run_grafts
from graft.core.execution.routing import engine_path
from graft.core.families.arch import family_of
from graft.core.language.spec import parse_spec
from graft.core.planning.plan import GraftRow

SMOKE_SPECS = [
    "none",
    "ALL:all:all; head=donor",
    "FE:all:all",
    "LT:all:all",
    "FE+LT:all:all",
    "(FE+LT)^C:all:all",
    "LT:q4:o,ffn",
]
#: spec -> the model whose plain forward pass it must reproduce.
INVARIANTS = {"none": "base", "ALL:all:all; head=donor": "donor"}
#: The engine's float32 bound against an independent computation.
TOLERANCE = 1e-5


def check_family(
    base: nn.Module, donor: nn.Module, seed: int = 0
) -> tuple[list[tuple[str, float]], list[str], dict[str, Any]]:
    """Graft ``donor`` into ``base`` (HF causal LMs of one family with a vocabulary of at
    least 96 tokens, e.g. :func:`graft.models.tiny.tiny_pair`'s) in one pass, on three
    prompts drawn with ``seed``.

    Returns:
        (spec, max |logit - base logit|) per spec; the failed invariants (empty when
        grafting nothing gives the base's own logits and grafting everything with the donor's
        head gives the donor's, within :data:`TOLERANCE`), each naming the family; and the
        engine path on the pair (:func:`graft.core.execution.routing.engine_path`).
    """
    family = family_of(base).name
    g = torch.Generator().manual_seed(seed)
    prompts = [[1] + torch.randint(3, 96, (n,), generator=g).tolist() for n in (6, 9, 12)]
    rows = [GraftRow(p, {"FE": [1, 2]}, parse_spec(s)) for s in SMOKE_SPECS for p in prompts]
    out = run_grafts(base, {"sft": donor}, rows)
    assert isinstance(out, torch.Tensor)  # logits: no targets were given
    logits = out.reshape(len(SMOKE_SPECS), len(prompts), -1)
    with torch.no_grad():
        plain = {
            name: torch.stack([model(torch.tensor([p])).logits[0, -1].float() for p in prompts])
            for name, model in (("base", base), ("donor", donor))
        }
    shifts = [
        (s, float((logits[i] - plain["base"]).abs().max())) for i, s in enumerate(SMOKE_SPECS)
    ]
    failed = []
    for spec, model in INVARIANTS.items():
        diff = float((logits[SMOKE_SPECS.index(spec)] - plain[model]).abs().max())
        if diff > TOLERANCE:
            failed.append(f"{family}: {spec!r} differs from the {model} by {diff:.2e}")
    return shifts, failed, engine_path(base, {"sft": donor})


def path_word(path: dict) -> str:
    """One word for an :func:`graft.core.execution.engine.engine_path`: ``prefix`` (every shortcut,
    the shared prefix through its cache argument) or ``whole`` (rows run whole: slower)."""
    return "prefix" if path["shared_prefix"] else "whole"


@dataclass
class SelfCheck:
    """:func:`self_check`'s findings.

    Args:
        shifts: family -> max |logit - base logit| per spec of :data:`SMOKE_SPECS`.
        failures: the failed invariants, each naming its family (empty: every one held).
        paths: family -> the engine path on its pair.
    """

    shifts: dict[str, list[float]]
    failures: list[str]
    paths: dict[str, dict[str, Any]]

    def lines(self) -> list[str]:
        """A table, a graft a row and a family a column, the engine path of each family
        under it, then each reason a family takes the slow path."""
        lines = [_row("graft", self.shifts, ">10")]
        for i, spec in enumerate(SMOKE_SPECS):
            lines.append(_row(spec, (s[i] for s in self.shifts.values()), ">10.4f"))
        lines.append(_row("engine path", map(path_word, self.paths.values()), ">10"))
        reasons = dict.fromkeys(r for p in self.paths.values() for r in p["fallbacks"])
        return lines + [f"slow path: {reason}" for reason in reasons]

    def ok_line(self) -> str:
        """What held, in one line (when nothing failed)."""
        n = len(self.shifts)
        return (
            f"ok: grafting nothing gives the base's logits and grafting everything with the "
            f"donor's head the donor's, within {TOLERANCE:g}, in {n} "
            f"famil{'y' if n == 1 else 'ies'}"
        )


def self_check(pairs: Iterable[tuple[str, tuple[nn.Module, nn.Module]]]) -> SelfCheck:
    """:func:`check_family` on each (family, (base, donor)) of ``pairs``, in order (a
    generator builds each pair only when its turn comes)."""
    found = SelfCheck({}, [], {})
    for name, (base, donor) in pairs:
        shifts, failed, found.paths[name] = check_family(base, donor)
        found.failures += failed
        found.shifts[name] = [shift for _, shift in shifts]
    return found


def _row(label: str, values: Iterable[Any], form: str) -> str:
    return f"{label:<24}" + "".join(f"{value:{form}}" for value in values)
