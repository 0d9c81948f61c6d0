"""The graft spec: which positions x which layers x which components come from which donor.

Text form (one line, usable on the command line)::

    RULE ; RULE ; ... [; head=POLICY] [; protocol=PROTOCOL]

    RULE     := POSITIONS : LAYERS : COMPONENTS [@DONOR]
    POSITIONS:= a union of terms joined by '+', each term optionally complemented by '^C':
                FE, M, R, first_actor, ... (any named span of the prompt), LT (last token),
                ALL, an index (0 = first token incl. BOS, -1 = last), a range 'i..j'
                (inclusive), or a parenthesised union: '(FE+LT)^C'
    LAYERS   := comma-separated: all | h1 h2 (halves) | q1..q4 (quarters) | e1..e8 (eighths)
                | k/n (the k-th of n equal groups, 1-based) | i (one layer, negative from the
                end) | i-j (inclusive range)
    COMPONENTS := comma-separated component names (see graft.core.families.arch) or groups:
                attn = the attention block (q,k,v, q_norm,k_norm where present, o; under
                protocol=paper q,k,v as the paper's ATTN)   qkv = q,k,v
                ffn = mlp = gate,up,down   ffn_up = gate,up   ffn_down = down
                norms = every per-layer norm   block = everything parameterised in a layer
                all = embed, pos_embed and block
    DONOR    := a donor name (default 'sft')
    POLICY   := base (default: the base's final norm and unembedding) | donor[@NAME][:all]
                (':all': the donor's head reads out every position, not only the last one;
                what a trace of all positions' logits shows) | paper (as the paper's code did: a tied embedding grafted at the last token
                also swaps the unembedding)
    PROTOCOL := graft (default) | paper, written '; protocol=paper': resolve the spec as the
                paper's code did: layer groups by its rule (q = L // 4, see
                graft.core.language.selectors; eighths refused) and 'all' = embed and block, without
                a learned position embedding (pos_embed), which the paper never grafted

Every part between ';'s is non-empty (no trailing ';'), and ``head=`` and ``protocol=``
are each written at most once.

Examples: ``FE+LT:all:all``, ``LT:q4:o,ffn``, ``FE:all:all@task; LT:h2:o,ffn@relation``,
``ALL:all:all; head=donor``, ``none`` (graft nothing).

Layer groups: the k-th of n groups of an L-layer model is layers
``floor((k-1)*L/n) .. floor(k*L/n)-1``, so every group is non-empty whenever L >= n (the
paper's code had an always-empty eighth); ``protocol=paper`` uses the paper's rule instead
(:mod:`graft.core.language.selectors`). ``embed`` and ``pos_embed`` belong to no layer:
the layer field does not restrict them.

Order rule: when two rules claim the same (position, layer, component) cell, the LATER rule
wins. The head policy applies to the readout at the last position only, unless written
``head=donor:all``.

This module holds the spec objects (:class:`Rule`, :class:`GraftSpec`, :class:`ResolvedGraft`);
the component vocabulary and the protocols' resolution rules live in
:mod:`graft.core.language.vocabulary`, the POSITIONS and LAYERS grammar in
:mod:`graft.core.language.selectors`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from graft.core.language.selectors import (
    NAME_RE,
    LayerItem,
    format_positions,
    layer_list,
    parse_layers,
    parse_positions,
    position_set,
    span_names,
)
from graft.core.language.vocabulary import (
    COMPONENT_GROUPS,
    DEFAULT_PROTOCOL,
    EMBEDDING_COMPONENTS,
    GROUPS_HELP,
    KNOWN_COMPONENTS,
    PROTOCOLS,
    RESOLUTIONS,
    SPECIAL_GROUPS,
    Resolution,
    expand_components,
    fused_qkv,
    paper_fused_qkv,
)
from graft.errors import SpecError

if TYPE_CHECKING:
    from graft.core.families.arch import Architecture

DEFAULT_DONOR = "sft"
HEAD_POLICIES = ("base", "donor", "paper")


# ---------------------------------------------------------------------------------- spec


@dataclass(frozen=True)
class Rule:
    """One rule of a graft spec.

    Args:
        positions: position expression, e.g. ``"FE+LT"``, ``"(FE+LT)^C"``, ``"-1"``.
        layers: layer selector, e.g. ``"all"``, ``"q4"``, ``"3-7"``, ``"0,2"``.
        components: component names or groups, e.g. ``("o", "ffn")``.
        donor: name of the donor model whose weights these cells use.
    """

    positions: str
    layers: str
    components: tuple[str, ...]
    donor: str = DEFAULT_DONOR

    def __post_init__(self) -> None:
        object.__setattr__(self, "positions", format_positions(parse_positions(self.positions)))
        items = parse_layers(self.layers)
        object.__setattr__(self, "layers", ",".join(i.strip() for i in self.layers.split(",")))
        self._layer_items: tuple[LayerItem, ...]  # not a field: out of eq, repr and asdict
        object.__setattr__(self, "_layer_items", items)
        comps = tuple(self.components)
        if not comps or any(not c for c in comps):
            raise SpecError(f"rule {self.positions}:{self.layers}: no components named")
        known = set(KNOWN_COMPONENTS) | set(COMPONENT_GROUPS) | set(SPECIAL_GROUPS)
        for c in comps:
            if c not in known:
                raise SpecError(
                    f"unknown component {c!r}: use {', '.join(KNOWN_COMPONENTS)} or a group "
                    f"({GROUPS_HELP})"
                )
        object.__setattr__(self, "components", comps)
        if not NAME_RE.match(self.donor):
            raise SpecError(f"donor name {self.donor!r} must be an identifier, e.g. sft or task")

    def __str__(self) -> str:
        text = f"{self.positions}:{self.layers}:{','.join(self.components)}"
        return text if self.donor == DEFAULT_DONOR else f"{text}@{self.donor}"

    def position_set(
        self, length: int, spans: dict[str, list[int]], prompt_length: int | None = None
    ) -> set[int]:
        """Positions (0-based, in a row of ``length`` tokens whose first ``prompt_length``
        are the prompt; see :func:`graft.core.language.selectors.position_set`) this rule
        selects."""
        return position_set(
            parse_positions(self.positions), length, spans, self.positions, prompt_length
        )

    def span_names(self) -> set[str]:
        """Named spans (e.g. FE, M) this rule's positions refer to."""
        return span_names(parse_positions(self.positions))

    def layer_list(self, n_layers: int, rule: str = "graft") -> list[int]:
        """Layers this rule selects in a model of ``n_layers`` layers, with the layer-group
        rule ``rule`` (``graft`` or ``paper``, see :mod:`graft.core.language.selectors`)."""
        return layer_list(self._layer_items, n_layers, self.layers, rule)


@dataclass(frozen=True)
class ResolvedGraft:
    """A graft spec applied to one model and one prompt.

    Args:
        cells: ``(layer, component) -> {position: donor}``; layer -1 holds ``embed`` and
            ``pos_embed``.
        final_norm_donor: donor whose final norm reads out the last position (None = base).
        unembed_donor: donor whose unembedding reads out the last position (None = base).
        head_everywhere: the head's donors read out every position, not only the last.
    """

    cells: dict[tuple[int, str], dict[int, str]]
    final_norm_donor: str | None = None
    unembed_donor: str | None = None
    head_everywhere: bool = False

    def donors(self) -> set[str]:
        """Names of all donors this graft uses."""
        names = {d for cell in self.cells.values() for d in cell.values()}
        return names | {d for d in (self.final_norm_donor, self.unembed_donor) if d}


def _split_fields(body: str) -> list[str]:
    """A rule's ``POSITIONS:LAYERS:COMPONENTS`` fields: split at the colons outside a span
    part's brackets (``FE[:-1]:all:all``)."""
    fields, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        depth += (ch == "[") - (ch == "]")
        if ch == ":" and depth == 0:
            fields.append(body[start:i])
            start = i + 1
    return [*fields, body[start:]]


@dataclass(frozen=True)
class GraftSpec:
    """A graft: rules (later ones win on overlap) plus a head policy.

    Args:
        rules: the rules, applied in order.
        head: ``"base"`` (default), ``"donor"`` or ``"paper"`` (see module docstring).
        head_donor: donor whose head is used when ``head == "donor"``.
        name: optional label for tables and plots (defaults to the text form).
        protocol: ``"graft"`` (default) or ``"paper"``: how layer groups and ``all`` resolve
            (see module docstring).
        head_everywhere: with ``head == "donor"``, the donor's head reads out every
            position (``head=donor:all``), not only the last.
    """

    rules: tuple[Rule, ...] = ()
    head: str = "base"
    head_donor: str = DEFAULT_DONOR
    name: str | None = field(default=None, compare=False)
    protocol: str = DEFAULT_PROTOCOL
    head_everywhere: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "rules", tuple(self.rules))
        if self.head not in HEAD_POLICIES:
            raise SpecError(f"head policy {self.head!r} unknown: use base, donor or paper")
        if self.protocol not in PROTOCOLS:
            raise SpecError(f"protocol {self.protocol!r} unknown: use graft or paper")
        if self.head_everywhere and self.head != "donor":
            raise SpecError(
                f"head={self.head}:all: only the donor's head reads out every position; "
                "write head=donor:all (or head=donor@NAME:all)"
            )

    def _meaning(self) -> tuple:
        return (self.rules, self.head, self.head_donor, self.protocol, self.head_everywhere)

    def __eq__(self, other: object) -> bool:
        """Equal to a GraftSpec or a spec text that means the same (the name aside)."""
        if isinstance(other, str):
            try:
                other = GraftSpec.parse(other)
            except SpecError:
                return False
        if not isinstance(other, GraftSpec):
            return NotImplemented
        return self._meaning() == other._meaning()

    def __hash__(self) -> int:
        return hash(self._meaning())

    # ------------------------------------------------------------------ text / JSON
    @classmethod
    def parse(cls, text: str, name: str | None = None) -> GraftSpec:
        """Parse the text form (see module docstring)."""
        if not text.strip():  # an empty spec would silently run the base alone
            label = f"graft {name!r}: " if name else ""
            raise SpecError(
                f"{label}empty spec; write one such as LT:all:all, or 'none' for the base alone"
            )
        rules: list[Rule] = []
        head, head_donor, protocol, everywhere = "base", DEFAULT_DONOR, DEFAULT_PROTOCOL, False
        parts = [p.strip() for p in text.split(";")]
        seen: set[str] = set()
        for part in parts:
            if not part:
                raise SpecError(
                    f"{text!r}: an empty part between ';'s; drop the stray ';' "
                    "(parts are RULE; RULE; head=...; protocol=...)"
                )
            key = part.partition("=")[0]
            if key in ("head", "protocol"):
                if key in seen:
                    raise SpecError(f"{text!r}: {key}= given twice; keep one")
                seen.add(key)
            if part.lower() in ("none", "pre"):
                continue
            if part.startswith("protocol="):
                protocol = part[len("protocol=") :]
                if protocol not in PROTOCOLS:
                    raise SpecError(f"{part!r}: protocol must be graft or paper")
                continue
            if part.startswith("head="):
                value = part[len("head=") :]
                everywhere = value.endswith(":all")
                if everywhere:
                    value = value[: -len(":all")]
                head, _, donor = value.partition("@")
                if head not in HEAD_POLICIES:
                    raise SpecError(f"{part!r}: head policy must be base, donor or paper")
                head_donor = donor or DEFAULT_DONOR
                continue
            body, _, donor = part.partition("@")
            fields = _split_fields(body)
            if len(fields) != 3:
                raise SpecError(
                    f"rule {part!r} needs three ':'-separated fields POSITIONS:LAYERS:COMPONENTS, "
                    "e.g. FE+LT:all:all or LT:q4:o,ffn"
                )
            pos, layers, comps = (f.strip() for f in fields)
            if not layers:
                raise SpecError(f"rule {part!r}: empty layer field (use 'all')")
            rules.append(
                Rule(
                    pos, layers, tuple(c.strip() for c in comps.split(",")), donor or DEFAULT_DONOR
                )
            )
        return cls(tuple(rules), head, head_donor, name, protocol, everywhere)

    def __str__(self) -> str:
        parts = [str(r) for r in self.rules] or ["none"]
        if self.head != "base":
            head = self.head
            if self.head == "donor" and self.head_donor != DEFAULT_DONOR:
                head += f"@{self.head_donor}"
            if self.head_everywhere:
                head += ":all"
            parts.append(f"head={head}")
        if self.protocol != DEFAULT_PROTOCOL:  # the default is not written
            parts.append(f"protocol={self.protocol}")
        return "; ".join(parts)

    @property
    def label(self) -> str:
        """The name if given, else the text form."""
        return self.name or str(self)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; ``from_dict`` inverts it."""
        return {
            "name": self.name,
            "head": self.head,
            "head_donor": self.head_donor,
            "protocol": self.protocol,
            **({"head_everywhere": True} if self.head_everywhere else {}),
            "rules": [
                {
                    "positions": r.positions,
                    "layers": r.layers,
                    "components": list(r.components),
                    "donor": r.donor,
                }
                for r in self.rules
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GraftSpec:
        """Inverse of ``to_dict``."""
        try:
            rules = tuple(
                Rule(
                    r["positions"],
                    r["layers"],
                    tuple(r["components"]),
                    r.get("donor", DEFAULT_DONOR),
                )
                for r in data.get("rules", [])
            )
            return cls(
                rules,
                data.get("head", "base"),
                data.get("head_donor", DEFAULT_DONOR),
                data.get("name"),
                data.get("protocol", DEFAULT_PROTOCOL),
                bool(data.get("head_everywhere", False)),
            )
        except (KeyError, TypeError) as exc:
            raise SpecError(f"graft spec JSON is missing or mistypes a field: {exc}") from exc

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> GraftSpec:
        return cls.from_dict(json.loads(text))

    # ------------------------------------------------------------------ resolution
    def span_names(self) -> set[str]:
        """Named spans every prompt must have for this spec to apply."""
        return set().union(*(r.span_names() for r in self.rules))

    def donors(self) -> set[str]:
        """Donor names this spec can use."""
        names = {r.donor for r in self.rules}
        if self.head == "donor":
            names.add(self.head_donor)
        return names

    def resolve(
        self,
        arch: Architecture,
        length: int,
        spans: dict[str, list[int]],
        prompt_length: int | None = None,
    ) -> ResolvedGraft:
        """Cells of this spec for a prompt of ``length`` tokens with ``spans`` on ``arch``;
        with ``prompt_length``, the tokens after the first ``prompt_length`` are a
        continuation (:func:`graft.core.language.selectors.position_set` says where each position
        expression lands there)."""
        if length < 1:
            raise SpecError("cannot graft an empty prompt")
        cells: dict[tuple[int, str], dict[int, str]] = {}
        for rule in self.rules:
            positions = sorted(rule.position_set(length, spans, prompt_length))
            components = expand_components(
                rule.components, arch.components, arch.family, self.protocol
            )
            resolution = RESOLUTIONS[self.protocol]
            if resolution.fused_q_whole and fused_qkv(arch):
                components = paper_fused_qkv(components)
            layers = rule.layer_list(arch.n_layers, resolution.layer_rule)
            for comp in components:
                targets = [-1] if comp in EMBEDDING_COMPONENTS else layers
                for layer in targets:
                    cell = cells.setdefault((layer, comp), {})
                    for p in positions:
                        cell[p] = rule.donor
        cells = {k: v for k, v in cells.items() if v}
        final_norm = unembed = None
        if self.head == "donor":
            final_norm = unembed = self.head_donor
        elif self.head == "paper" and arch.tied_embeddings:
            unembed = cells.get((-1, "embed"), {}).get(length - 1)
        return ResolvedGraft(cells, final_norm, unembed, self.head_everywhere)


def parse_spec(text: str, name: str | None = None) -> GraftSpec:
    """Shorthand for ``GraftSpec.parse``."""
    return GraftSpec.parse(text, name)


__all__ = [
    "COMPONENT_GROUPS",
    "DEFAULT_DONOR",
    "EMBEDDING_COMPONENTS",
    "HEAD_POLICIES",
    "KNOWN_COMPONENTS",
    "PROTOCOLS",
    "RESOLUTIONS",
    "GraftSpec",
    "ResolvedGraft",
    "Resolution",
    "Rule",
    "expand_components",
    "fused_qkv",
    "paper_fused_qkv",
    "parse_spec",
]
