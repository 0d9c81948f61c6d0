"""The graft spec: which positions x which layers x which components come from which donor.

Text form (one line, usable on the command line)::

    RULE ; RULE ; ... [; head=POLICY]

    RULE     := POSITIONS : LAYERS : COMPONENTS [@DONOR]
    POSITIONS:= a union of terms joined by '+', each term optionally complemented by '^C':
                FE, M, R, first_actor, ... (any named span of the prompt), LT (last token),
                ALL, an index (0 = first token incl. BOS, -1 = last), a range 'i..j'
                (inclusive), or a parenthesised union: '(FE+LT)^C'
    LAYERS   := comma-separated: all | h1 h2 (halves) | q1..q4 (quarters) | e1..e8 (eighths)
                | k/n (the k-th of n equal groups, 1-based) | i (one layer, negative from the
                end) | i-j (inclusive range)
    COMPONENTS := comma-separated component names (see graft.core.arch) or groups:
                attn = q,k,v   ffn = gate,up,down   ffn_up = gate,up   ffn_down = down
                norms = every per-layer norm   block = everything parameterised in a layer
                all = embed, pos_embed and block
    DONOR    := a donor name (default 'sft')
    POLICY   := base (default: the base's final norm and unembedding) | donor[@NAME]
                | paper (as the paper's code did: a tied embedding grafted at the last token
                also swaps the unembedding)

Examples: ``FE+LT:all:all``, ``LT:q4:o,ffn``, ``FE:all:all@task; LT:h2:o,ffn@relation``,
``ALL:all:all; head=donor``, ``none`` (graft nothing).

Layer groups: the k-th of n groups of an L-layer model is layers
``floor((k-1)*L/n) .. floor(k*L/n)-1``, so every group is non-empty whenever L >= n (the
paper's code had an always-empty eighth). ``embed`` and ``pos_embed`` belong to no layer:
the layer field does not restrict them.

Order rule: when two rules claim the same (position, layer, component) cell, the LATER rule
wins. The head policy applies to the readout at the last position only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from graft.errors import SpecError

if TYPE_CHECKING:
    from graft.core.arch import Architecture

DEFAULT_DONOR = "sft"
HEAD_POLICIES = ("base", "donor", "paper")
EMBEDDING_COMPONENTS = ("embed", "pos_embed")
COMPONENT_GROUPS = {
    "attn": ("q", "k", "v"),
    "ffn": ("gate", "up", "down"),
    "ffn_up": ("gate", "up"),
    "ffn_down": ("down",),
}
# Every logical component any supported family has; a family may lack some (graft.core.arch).
KNOWN_COMPONENTS = (
    "embed",
    "pos_embed",
    "ln_1",
    "q",
    "k",
    "v",
    "q_norm",
    "k_norm",
    "o",
    "ln_post_attn",
    "ln_2",
    "gate",
    "up",
    "down",
    "ln_post_ffn",
)
_SPECIAL_GROUPS = ("norms", "block", "all")
_NAMED_FRACTIONS = {"h": 2, "q": 4, "e": 8}
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# ----------------------------------------------------------------------------- positions


@dataclass(frozen=True)
class _Atom:
    kind: str  # "span" | "LT" | "ALL" | "index" | "range"
    name: str = ""
    start: int = 0
    stop: int = 0


@dataclass(frozen=True)
class _Union:
    terms: tuple  # of (_Atom | _Union, complemented: bool)


def _tokenize_positions(text: str) -> list[str]:
    tokens = re.findall(r"\^C|\(|\)|\+|-?\d+\.\.-?\d+|-?\d+|[A-Za-z_][A-Za-z0-9_]*|\S", text)
    return tokens


def _parse_positions(text: str) -> _Union:
    tokens = _tokenize_positions(text)
    if not tokens:
        raise SpecError("empty position selector: name positions such as FE, LT, FE+LT or ALL")
    pos = 0

    def parse_union() -> _Union:
        nonlocal pos
        terms = [parse_term()]
        while pos < len(tokens) and tokens[pos] == "+":
            pos += 1
            terms.append(parse_term())
        return _Union(tuple(terms))

    def parse_term():
        nonlocal pos
        if pos >= len(tokens):
            raise SpecError(f"position selector {text!r} ends early: a name is missing after '+'")
        tok = tokens[pos]
        pos += 1
        if tok == "(":
            inner = parse_union()
            if pos >= len(tokens) or tokens[pos] != ")":
                raise SpecError(f"position selector {text!r}: missing ')'")
            pos += 1
            atom = inner
        elif re.fullmatch(r"-?\d+\.\.-?\d+", tok):
            a, b = tok.split("..")
            atom = _Atom("range", start=int(a), stop=int(b))
        elif re.fullmatch(r"-?\d+", tok):
            atom = _Atom("index", start=int(tok))
        elif tok == "LT":
            atom = _Atom("LT")
        elif tok == "ALL":
            atom = _Atom("ALL")
        elif _NAME_RE.match(tok):
            atom = _Atom("span", name=tok)
        else:
            raise SpecError(f"position selector {text!r}: unexpected {tok!r}")
        complemented = False
        if pos < len(tokens) and tokens[pos] == "^C":
            pos += 1
            complemented = True
        return (atom, complemented)

    union = parse_union()
    if pos != len(tokens):
        raise SpecError(f"position selector {text!r}: unexpected {tokens[pos]!r}")
    return union


def _format_positions(node) -> str:
    if isinstance(node, _Union):
        return "+".join(_format_term(a, c) for a, c in node.terms)
    raise TypeError(node)


def _format_term(atom, complemented: bool) -> str:
    if isinstance(atom, _Union):
        body = _format_positions(atom)
        text = f"({body})" if complemented or len(atom.terms) > 1 else body
    elif atom.kind == "span":
        text = atom.name
    elif atom.kind in ("LT", "ALL"):
        text = atom.kind
    elif atom.kind == "index":
        text = str(atom.start)
    else:
        text = f"{atom.start}..{atom.stop}"
    return text + ("^C" if complemented else "")


def _eval_positions(node, length: int, spans: dict[str, list[int]], text: str) -> set[int]:
    result: set[int] = set()
    for atom, complemented in node.terms:
        if isinstance(atom, _Union):
            part = _eval_positions(atom, length, spans, text)
        elif atom.kind == "LT":
            part = {length - 1}
        elif atom.kind == "ALL":
            part = set(range(length))
        elif atom.kind == "span":
            if atom.name not in spans:
                have = ", ".join(sorted(spans)) or "none"
                raise SpecError(
                    f"position {atom.name!r} in {text!r} is not a span of this prompt "
                    f"(spans here: {have}); use one of those, LT, ALL or an index"
                )
            part = set(spans[atom.name])
            if not part:
                raise SpecError(f"span {atom.name!r} in {text!r} is empty for this prompt")
            bad = [p for p in part if not 0 <= p < length]
            if bad:
                raise SpecError(f"span {atom.name!r} has positions {bad} outside 0..{length - 1}")
        else:
            lo, hi = atom.start, atom.stop if atom.kind == "range" else atom.start
            lo, hi = (lo + length if lo < 0 else lo), (hi + length if hi < 0 else hi)
            if not (0 <= lo < length and 0 <= hi < length) or lo > hi:
                raise SpecError(
                    f"position {_format_term(atom, False)!r} in {text!r} is out of range for "
                    f"a prompt of {length} tokens"
                )
            part = set(range(lo, hi + 1))
        if complemented:
            part = set(range(length)) - part
        result |= part
    return result


# -------------------------------------------------------------------------------- layers


def _parse_layer_item(item: str, text: str) -> tuple:
    item = item.strip()
    if item == "all":
        return ("frac", 1, 1)
    aliases = {
        "first_half": (1, 2),
        "last_half": (2, 2),
        "first_quarter": (1, 4),
        "last_quarter": (4, 4),
    }
    if item in aliases:
        return ("frac", *aliases[item])
    m = re.fullmatch(r"([hqe])(\d+)", item)
    if m:
        n = _NAMED_FRACTIONS[m.group(1)]
        k = int(m.group(2))
        if not 1 <= k <= n:
            raise SpecError(f"layer group {item!r} in {text!r}: {m.group(1)}1..{m.group(1)}{n}")
        return ("frac", k, n)
    m = re.fullmatch(r"(\d+)/(\d+)", item)
    if m:
        k, n = int(m.group(1)), int(m.group(2))
        if not 1 <= k <= n:
            raise SpecError(f"layer group {item!r} in {text!r}: need 1 <= k <= n in k/n")
        return ("frac", k, n)
    m = re.fullmatch(r"(\d+)-(\d+)", item)
    if m:
        a, b = int(m.group(1)), int(m.group(2))
        if a > b:
            raise SpecError(f"layer range {item!r} in {text!r} is reversed: write {b}-{a}")
        return ("range", a, b)
    if re.fullmatch(r"-?\d+", item):
        return ("index", int(item), 0)
    raise SpecError(
        f"layer selector {item!r} in {text!r} not understood: use all, h1/h2, q1..q4, e1..e8, "
        "k/n, a layer index or a range i-j"
    )


def layer_group(k: int, n: int, n_layers: int) -> list[int]:
    """Layers of the k-th (1-based) of n equal groups of an ``n_layers``-layer model."""
    return list(range(((k - 1) * n_layers) // n, (k * n_layers) // n))


def _eval_layers(items: tuple, n_layers: int, text: str) -> list[int]:
    layers: set[int] = set()
    for kind, a, b in items:
        if kind == "frac":
            group = layer_group(a, b, n_layers)
            if not group:
                raise SpecError(
                    f"layer group {a}/{b} in {text!r} is empty for a model with {n_layers} layers"
                )
            layers.update(group)
        elif kind == "range":
            if b >= n_layers:
                raise SpecError(
                    f"layer range {a}-{b} in {text!r} is out of range: the model has "
                    f"layers 0-{n_layers - 1}"
                )
            layers.update(range(a, b + 1))
        else:
            idx = a + n_layers if a < 0 else a
            if not 0 <= idx < n_layers:
                raise SpecError(
                    f"layer {a} in {text!r} is out of range: the model has layers 0-{n_layers - 1}"
                )
            layers.add(idx)
    return sorted(layers)


# ---------------------------------------------------------------------------- components


def expand_components(names: tuple[str, ...], available: tuple[str, ...], family: str) -> list[str]:
    """Expand groups and check every name exists for ``family`` (whose components are ``available``)."""
    out: list[str] = []
    layer_components = [c for c in available if c not in EMBEDDING_COMPONENTS]
    for name in names:
        if name == "all":
            expanded = list(available)
        elif name == "block":
            expanded = layer_components
        elif name == "norms":
            expanded = [c for c in layer_components if c.startswith("ln_") or c.endswith("_norm")]
        elif name in COMPONENT_GROUPS:
            # a group takes the members this family has (GPT-2 has no gate)
            expanded = [c for c in COMPONENT_GROUPS[name] if c in available]
        elif name in available:
            expanded = [name]
        else:
            raise SpecError(
                f"component {name!r} does not exist in the {family} family; it has: "
                f"{', '.join(available)} (groups: attn, ffn, ffn_up, ffn_down, norms, block, all)"
            )
        out.extend(c for c in expanded if c not in out)
    return out


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
        object.__setattr__(self, "positions", _format_positions(_parse_positions(self.positions)))
        items = tuple(_parse_layer_item(i, self.layers) for i in self.layers.split(","))
        object.__setattr__(self, "layers", ",".join(i.strip() for i in self.layers.split(",")))
        object.__setattr__(self, "_layer_items", items)
        comps = tuple(self.components)
        if not comps or any(not c for c in comps):
            raise SpecError(f"rule {self.positions}:{self.layers}: no components named")
        known = set(KNOWN_COMPONENTS) | set(COMPONENT_GROUPS) | set(_SPECIAL_GROUPS)
        for c in comps:
            if c not in known:
                raise SpecError(
                    f"unknown component {c!r}: use {', '.join(KNOWN_COMPONENTS)} or a group "
                    "(attn, ffn, ffn_up, ffn_down, norms, block, all)"
                )
        object.__setattr__(self, "components", comps)
        if not _NAME_RE.match(self.donor):
            raise SpecError(f"donor name {self.donor!r} must be an identifier, e.g. sft or task")

    def __str__(self) -> str:
        text = f"{self.positions}:{self.layers}:{','.join(self.components)}"
        return text if self.donor == DEFAULT_DONOR else f"{text}@{self.donor}"

    def position_set(self, length: int, spans: dict[str, list[int]]) -> set[int]:
        """Positions (0-based, in a prompt of ``length`` tokens) this rule selects."""
        return _eval_positions(_parse_positions(self.positions), length, spans, self.positions)

    def span_names(self) -> set[str]:
        """Named spans (e.g. FE, M) this rule's positions refer to."""
        names: set[str] = set()

        def walk(node) -> None:
            for atom, _ in node.terms:
                if isinstance(atom, _Union):
                    walk(atom)
                elif atom.kind == "span":
                    names.add(atom.name)

        walk(_parse_positions(self.positions))
        return names

    def layer_list(self, n_layers: int) -> list[int]:
        """Layers this rule selects in a model of ``n_layers`` layers."""
        return _eval_layers(self._layer_items, n_layers, self.layers)


@dataclass(frozen=True)
class ResolvedGraft:
    """A graft spec applied to one model and one prompt.

    Args:
        cells: ``(layer, component) -> {position: donor}``; layer -1 holds ``embed`` and
            ``pos_embed``.
        final_norm_donor: donor whose final norm reads out the last position (None = base).
        unembed_donor: donor whose unembedding reads out the last position (None = base).
    """

    cells: dict[tuple[int, str], dict[int, str]]
    final_norm_donor: str | None = None
    unembed_donor: str | None = None

    def donors(self) -> set[str]:
        """Names of all donors this graft uses."""
        names = {d for cell in self.cells.values() for d in cell.values()}
        return names | {d for d in (self.final_norm_donor, self.unembed_donor) if d}


@dataclass(frozen=True)
class GraftSpec:
    """A graft: rules (later ones win on overlap) plus a head policy.

    Args:
        rules: the rules, applied in order.
        head: ``"base"`` (default), ``"donor"`` or ``"paper"`` (see module docstring).
        head_donor: donor whose head is used when ``head == "donor"``.
        name: optional label for tables and plots (defaults to the text form).
    """

    rules: tuple[Rule, ...] = ()
    head: str = "base"
    head_donor: str = DEFAULT_DONOR
    name: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rules", tuple(self.rules))
        if self.head not in HEAD_POLICIES:
            raise SpecError(f"head policy {self.head!r} unknown: use base, donor or paper")

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
        head, head_donor = "base", DEFAULT_DONOR
        parts = [p.strip() for p in text.split(";")]
        for part in parts:
            if not part or part.lower() in ("none", "pre"):
                continue
            if part.startswith("head="):
                value = part[len("head=") :]
                head, _, donor = value.partition("@")
                if head not in HEAD_POLICIES:
                    raise SpecError(f"{part!r}: head policy must be base, donor or paper")
                head_donor = donor or DEFAULT_DONOR
                continue
            body, _, donor = part.partition("@")
            fields = body.split(":")
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
        return cls(tuple(rules), head, head_donor, name)

    def __str__(self) -> str:
        parts = [str(r) for r in self.rules] or ["none"]
        if self.head != "base":
            head = self.head
            if self.head == "donor" and self.head_donor != DEFAULT_DONOR:
                head += f"@{self.head_donor}"
            parts.append(f"head={head}")
        return "; ".join(parts)

    @property
    def label(self) -> str:
        """The name if given, else the text form."""
        return self.name or str(self)

    def to_dict(self) -> dict:
        """A JSON-ready dict; ``from_dict`` inverts it."""
        return {
            "name": self.name,
            "head": self.head,
            "head_donor": self.head_donor,
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
    def from_dict(cls, data: dict) -> GraftSpec:
        """Inverse of ``to_dict``."""
        try:
            rules = tuple(
                Rule(r["positions"], r["layers"], tuple(r["components"]), r.get("donor", "sft"))
                for r in data.get("rules", [])
            )
            return cls(
                rules, data.get("head", "base"), data.get("head_donor", "sft"), data.get("name")
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
        self, arch: Architecture, length: int, spans: dict[str, list[int]]
    ) -> ResolvedGraft:
        """Cells of this spec for a prompt of ``length`` tokens with ``spans`` on ``arch``."""
        if length < 1:
            raise SpecError("cannot graft an empty prompt")
        cells: dict[tuple[int, str], dict[int, str]] = {}
        for rule in self.rules:
            positions = sorted(rule.position_set(length, spans))
            components = expand_components(rule.components, arch.components, arch.family)
            layers = rule.layer_list(arch.n_layers)
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
        return ResolvedGraft(cells, final_norm, unembed)


def parse_spec(text: str, name: str | None = None) -> GraftSpec:
    """Shorthand for ``GraftSpec.parse``."""
    return GraftSpec.parse(text, name)
