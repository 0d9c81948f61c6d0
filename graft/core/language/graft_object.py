"""A graft as a Python object: :class:`Graft` says what a one-rule spec string says, with
Python values (lists of layers, a ``range``, a tuple of modules), and is accepted wherever a
spec is. ``Graft(...) + Graft(...)`` (and ``sum`` of several) is a spec of several rules (the
later wins on overlap), equal to its text: ``Graft("FE") + Graft("LT", modules="o") ==
"FE:all:all; LT:all:o"``.

    Graft(positions="FE+LT", layers="all", modules="all")          # FE+LT:all:all
    Graft(positions=["LT"], layers=range(20, 30), modules=("o", "mlp"))  # LT:20-29:o,mlp
    Graft(positions=-1, layers=[0, 2], modules="attn", donor="task")   # -1:0,2:attn@task
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from graft.core.language.spec import DEFAULT_DONOR, GraftSpec, Rule
from graft.core.language.vocabulary import DEFAULT_PROTOCOL
from graft.errors import SpecError

#: What a :class:`Graft`'s fields accept, besides the spec language's own text.
Positions = str | int | Sequence[str | int]
Layers = str | int | range | Sequence[int | str]
Modules = str | Sequence[str]


def _positions_text(positions: Positions) -> str:
    if isinstance(positions, str):
        return positions
    if isinstance(positions, int):
        return str(positions)
    terms = [str(p) for p in positions]
    if not terms:
        raise SpecError("Graft(positions=[]): name at least one position, e.g. 'LT' or -1")
    return "+".join(terms)


def _layers_text(layers: Layers) -> str:
    if isinstance(layers, str):
        return layers
    if isinstance(layers, int):
        return str(layers)
    if isinstance(layers, range):
        if layers.step != 1 or not layers:
            raise SpecError(f"Graft(layers={layers!r}): give a non-empty range of step 1")
        return f"{layers.start}-{layers.stop - 1}" if len(layers) > 1 else str(layers.start)
    items = [str(x) for x in layers]
    if not items:
        raise SpecError("Graft(layers=[]): name at least one layer, or 'all'")
    return ",".join(items)


def _modules_tuple(modules: Modules) -> tuple[str, ...]:
    if isinstance(modules, str):
        return tuple(m.strip() for m in modules.split(","))
    return tuple(modules)


@dataclass(frozen=True)
class Graft:
    """One rule of a graft, with its head policy, as a Python object.

    Args:
        positions: a position expression (``"FE+LT"``, ``"(FE+LT)^C"``, ``"ALL"``), an index
            (``-1``), or a list of terms joined as a union (``["FE", "LT"]``).
        layers: a layer selector (``"all"``, ``"q4"``, ``"3-7"``), a layer index, a list of
            indices, or a ``range`` of step 1.
        modules: component names or groups (``"all"``, ``"attn"``, ``("o", "mlp")``, or
            ``"o,mlp"``); see the spec language in :mod:`graft.core.language.spec`.
        donor: the donor whose weights the cells use.
        head: the readout: ``"base"``, ``"donor"``, ``"donor@NAME"``, ``"donor:all"`` (the
            donor's head at every position) or ``"paper"``.
        protocol: ``"graft"`` or ``"paper"`` (how layer groups and ``attn``/``all`` resolve).
    """

    positions: Positions
    layers: Layers = "all"
    modules: Modules = "all"
    donor: str = DEFAULT_DONOR
    head: str = "base"
    protocol: str = DEFAULT_PROTOCOL

    def __post_init__(self) -> None:
        self.spec  # noqa: B018 - bad values fail here, where the object is made

    @property
    def rule(self) -> Rule:
        """The spec :class:`~graft.core.language.spec.Rule` this graft is."""
        return Rule(
            _positions_text(self.positions),
            _layers_text(self.layers),
            _modules_tuple(self.modules),
            self.donor,
        )

    @property
    def spec(self) -> GraftSpec:
        """The equivalent :class:`~graft.core.language.spec.GraftSpec`."""
        head = "" if self.head == "base" else f"; head={self.head}"
        parsed = GraftSpec.parse(f"none{head}; protocol={self.protocol}")  # the parser checks it
        return GraftSpec(
            (self.rule,),
            parsed.head,
            parsed.head_donor,
            None,
            parsed.protocol,
            parsed.head_everywhere,
        )

    def __str__(self) -> str:
        return str(self.spec)

    def __eq__(self, other: object) -> bool:
        """Equal to another Graft, a GraftSpec or a spec text that means the same."""
        if isinstance(other, Graft):
            return self.spec == other.spec
        if isinstance(other, GraftSpec | str):
            return self.spec == as_spec(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.spec)

    def __add__(self, other: Graft | GraftSpec | str) -> GraftSpec:
        """A spec of this graft's rule, then ``other``'s (later rules win on overlap); the
        head and protocol must agree or be left at their defaults on one side."""
        return combine(self, other)

    def __radd__(self, other: Graft | GraftSpec | str | int) -> GraftSpec:
        """``other``'s rules, then this graft's: ``spec + Graft(...)``, ``"..." + Graft(...)``
        and ``sum([Graft(...), ...])`` (which starts from 0)."""
        if isinstance(other, int) and other == 0:
            return combine(self)
        if not isinstance(other, Graft | GraftSpec | str):
            return NotImplemented
        return combine(other, self)


def as_spec(spec: Graft | GraftSpec | str) -> GraftSpec:
    """A spec text, a :class:`Graft` or a :class:`GraftSpec` as a GraftSpec."""
    if isinstance(spec, GraftSpec):
        return spec
    if isinstance(spec, str):
        return GraftSpec.parse(spec)
    if isinstance(spec, Graft):
        return spec.spec
    raise SpecError(
        f"a graft is a spec text, a graft.Graft or a GraftSpec, not {type(spec).__name__}"
    )


def combine(*grafts: Graft | GraftSpec | str) -> GraftSpec:
    """One spec of the rules of ``grafts`` in order (the later wins on overlap)."""
    specs = [as_spec(g) for g in grafts]
    heads = {(s.head, s.head_donor, s.head_everywhere) for s in specs if s.head != "base"}
    protocols = {s.protocol for s in specs if s.protocol != DEFAULT_PROTOCOL}
    if len(heads) > 1 or len(protocols) > 1:
        raise SpecError(
            "the grafts combined set different heads or protocols; set head= and protocol= "
            "on one of them only"
        )
    head, head_donor, everywhere = heads.pop() if heads else ("base", DEFAULT_DONOR, False)
    protocol = protocols.pop() if protocols else DEFAULT_PROTOCOL
    rules = tuple(r for s in specs for r in s.rules)
    return GraftSpec(rules, head, head_donor, None, protocol, everywhere)
