"""What several engine tests share (the local engine, the direct path, the executors, the
hooked forwards, the remote blocks, layer resumption): the spec lists they graft, random rows
of token ids, a model's own forward pass on rows and a spy on the engine's steps, written
once so that the tests graft the same."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

import torch

from graft.core.language.spec import parse_spec
from graft.core.planning.plan import GraftRow

#: the paper's six base position sets (Fig. 2), as run on every template
BASE_POSITIONS = ["FE", "LT", "FE+LT", "(FE+LT)^C", "FE^C", "LT^C"]
#: each base position set, every layer, every component
BASE_POSITION_SPECS = [f"{positions}:all:all" for positions in BASE_POSITIONS]
#: the E1 position grafts, PRE (grafting nothing) and SFT (everything, the donor's head) included
E1_SPECS = ["none", "ALL:all:all; head=donor", *BASE_POSITION_SPECS]
#: the units a sweep grafts one layer at a time
SWEEP_UNITS = ("FE[:-1]", "FE[-1]", "(FE+LT)^C", "LT")


def layer_sweep(cells: Sequence[str], kinds: Sequence[str]) -> list[str]:
    """A sweep on the tiny models' 4 layers: the references (PRE, SFT), the whole-depth
    cells FE and FE+LT, ``cells``, then every unit of :data:`SWEEP_UNITS` x single layer x
    each of ``kinds``."""
    return [
        "none",
        "ALL:all:all; head=donor",
        "FE:all:all",
        "FE+LT:all:all",
        *cells,
        *(f"{unit}:{layer}:{kind}" for unit in SWEEP_UNITS for layer in range(4) for kind in kinds),
    ]


def random_rows(
    specs: Sequence[str],
    lengths: Sequence[int],
    spans: Mapping[str, list[int]] | None = None,
    seed: int = 0,
) -> list[GraftRow]:
    """One prompt of random ids (BOS 1, then ids 3 to 95) per length, each grafted by every
    spec in ``specs``, with ``spans`` (default: FE at positions 1 and 2)."""
    g = torch.Generator().manual_seed(seed)
    spans = {"FE": [1, 2]} if spans is None else spans
    rows = []
    for n in lengths:
        ids = [1] + torch.randint(3, 96, (n - 1,), generator=g).tolist()
        rows += [GraftRow(ids, _copy(spans), parse_spec(s)) for s in specs]
    return rows


def _copy(spans: Mapping[str, list[int]]) -> dict[str, list[int]]:
    return {name: list(positions) for name, positions in spans.items()}


def own_forward(model: torch.nn.Module, rows: Sequence[GraftRow]) -> torch.Tensor:
    """Last-token logits of ``model`` on the rows, right-padded in one batch."""
    width = max(len(r.input_ids) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r.input_ids)] = torch.tensor(r.input_ids)
        mask[i, : len(r.input_ids)] = 1
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    return torch.stack([logits[i, len(r.input_ids) - 1] for i, r in enumerate(rows)])


def spied(monkeypatch: Any, module: ModuleType, *names: str) -> dict[str, list]:
    """Every result of ``module``'s functions ``names`` in the test, by name, kept as it is
    returned (the functions still run)."""
    seen: dict[str, list] = {name: [] for name in names}
    for name, kept in seen.items():
        original = getattr(module, name)

        def spying(*args: Any, original: Any = original, kept: list = kept, **kwargs: Any) -> Any:
            kept.append(original(*args, **kwargs))
            return kept[-1]

        monkeypatch.setattr(module, name, spying)
    return seen
