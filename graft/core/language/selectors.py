"""Position and layer selectors of the spec language: parsing, formatting and evaluation.

The grammar (see :mod:`graft.core.language.spec` for the whole spec)::

    POSITIONS := a union of terms joined by '+', each term optionally complemented by '^C':
                 a named span (FE, M, ...), a part of one by Python indexing over its
                 tokens (FE[-1] its last token, FE[0] its first, FE[:-1] all but the last,
                 FE[1:]), LT (last token), ALL, an index (0 = first token incl. BOS,
                 -1 = last), a range 'i..j' (inclusive), or a parenthesised union
    LAYERS    := comma-separated: all | h1 h2 | q1..q4 | e1..e8 | k/n | from_middle | i | i-j

A position selector is parsed once into a :class:`PositionExpr` and evaluated per prompt
(:func:`position_set`; on a row that continues its prompt with tokens being scored, ``LT``
also covers those continuation positions); a layer selector into :data:`LayerItem` tuples
evaluated per model (:func:`layer_list`). Every error is a :class:`~graft.errors.SpecError` naming the bad part.

Layer groups follow one of two rules (:data:`LAYER_RULES`): ``graft`` (default) makes the
k-th of n groups layers ``floor((k-1)L/n) .. floor(kL/n)-1``, never empty when L >= n;
``paper`` is the rule of the paper's code, with ``q = L // 4``: quarters ``[0,q)``,
``[q,2q)``, ``[2q,3q)``, ``[3q,L)`` (the last takes the remainder), halves as quarter pairs
``[0,2q)`` and ``[2q,L)``. The paper's code computed eighths too, but wrongly (the third was
always empty, the fourth lay inside the second quarter, the seventh and eighth were never
returned), so the ``paper`` rule refuses eighths and any other k/n rather than invent them.
``from_middle`` is layers ``L // 2 .. L - 1`` under either rule (graft's ``h2``; the split
of the authors' E4 hybrid, which differs from their sweeps' ``[2q, L)`` when L mod 4 is 2
or 3).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from graft.errors import SpecError

#: An identifier: span names and donor names.
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NAMED_FRACTIONS = {"h": 2, "q": 4, "e": 8}
#: A run of more digits than this in a selector is refused (no model has that many positions
#: or layers; Python's int() refuses some 4,300 digits with a bare ValueError).
MAX_DIGITS = 18
#: One comma-separated item of a layer selector: ``("frac", k, n)``, ``("range", i, j)``,
#: ``("index", i, 0)`` or ``("from_middle", 0, 0)``.
LayerItem = tuple[str, int, int]


# ----------------------------------------------------------------------------- positions


@dataclass(frozen=True)
class _Atom:
    kind: str  # "span" | "LT" | "ALL" | "index" | "range"
    name: str = ""
    start: int = 0
    stop: int = 0
    # a span's part: the text between its brackets ("-1", ":-1", "1:"), "" for the whole span
    part: str = ""


_SPAN_PART = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\[(-?\d*)(?:(:)(-?\d*))?\]$")


def _span_part(positions: list[int], part: str) -> list[int]:
    """``part`` (the text inside ``NAME[...]``) of a span's sorted ``positions``."""
    if not part:
        return positions
    if ":" not in part:
        i = int(part)
        return [positions[i]] if -len(positions) <= i < len(positions) else []
    lo, _, hi = part.partition(":")
    return positions[slice(int(lo) if lo else None, int(hi) if hi else None)]


@dataclass(frozen=True)
class PositionExpr:
    """A parsed position selector: a union of terms.

    Args:
        terms: ``(atom, complemented)`` pairs; an atom is a name, index, range, ``LT``,
            ``ALL`` or a parenthesised :class:`PositionExpr`.
    """

    terms: tuple[tuple[_Atom | PositionExpr, bool], ...]  # (atom, complemented)


def _tokenize_positions(text: str) -> list[str]:
    tokens = re.findall(
        r"\^C|\(|\)|\+|-?\d+\.\.-?\d+|-?\d+|[A-Za-z_][A-Za-z0-9_]*\[[^\]]*\]"
        r"|[A-Za-z_][A-Za-z0-9_]*|\S",
        text,
    )
    return tokens


def _refuse_long_numbers(text: str, what: str) -> None:
    long = re.search(rf"\d{{{MAX_DIGITS + 1},}}", text)
    if long:
        raise SpecError(
            f"{what} selector {text[:60]!r}: a number of {len(long.group())} digits; give a "
            f"{what} of at most {MAX_DIGITS} digits"
        )


def parse_positions(text: str) -> PositionExpr:
    """Parse a position selector such as ``FE+LT`` or ``(FE+LT)^C``."""
    _refuse_long_numbers(text, "position")
    tokens = _tokenize_positions(text)
    if not tokens:
        raise SpecError("empty position selector: name positions such as FE, LT, FE+LT or ALL")
    pos = 0

    def parse_union() -> PositionExpr:
        nonlocal pos
        terms = [parse_term()]
        while pos < len(tokens) and tokens[pos] == "+":
            pos += 1
            terms.append(parse_term())
        return PositionExpr(tuple(terms))

    def parse_term() -> tuple[_Atom | PositionExpr, bool]:
        nonlocal pos
        if pos >= len(tokens):
            raise SpecError(f"position selector {text!r} ends early: a name is missing after '+'")
        tok = tokens[pos]
        pos += 1
        atom: _Atom | PositionExpr
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
        elif "[" in tok:
            m = _SPAN_PART.match(tok)
            if m is None or (m.group(3) is None and not m.group(2)):
                raise SpecError(
                    f"position selector {text!r}: {tok!r} is not a span part; write NAME[i] "
                    "(one token, e.g. FE[-1]) or NAME[i:j] (e.g. FE[:-1])"
                )
            part = m.group(2) + (":" + m.group(4) if m.group(3) else "")
            atom = _Atom("span", name=m.group(1), part=part)
        elif NAME_RE.match(tok):
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


def format_positions(node: PositionExpr) -> str:
    """The canonical text of a parsed selector (``parse_positions`` inverts it)."""
    if isinstance(node, PositionExpr):
        return "+".join(_format_term(a, c) for a, c in node.terms)
    raise TypeError(node)  # programming error: a node kind this evaluator lacks


def span_names(node: PositionExpr) -> set[str]:
    """Named spans (e.g. FE, M) a parsed selector refers to."""
    names: set[str] = set()
    for atom, _ in node.terms:
        if isinstance(atom, PositionExpr):
            names |= span_names(atom)
        elif atom.kind == "span":
            names.add(atom.name)
    return names


def _format_term(atom: _Atom | PositionExpr, complemented: bool) -> str:
    if isinstance(atom, PositionExpr):
        body = format_positions(atom)
        text = f"({body})" if complemented or len(atom.terms) > 1 else body
    elif atom.kind == "span":
        text = f"{atom.name}[{atom.part}]" if atom.part else atom.name
    elif atom.kind in ("LT", "ALL"):
        text = atom.kind
    elif atom.kind == "index":
        text = str(atom.start)
    else:
        text = f"{atom.start}..{atom.stop}"
    return text + ("^C" if complemented else "")


def position_set(
    node: PositionExpr,
    length: int,
    spans: dict[str, list[int]],
    text: str,
    prompt_length: int | None = None,
) -> set[int]:
    """Positions (0-based) ``node`` selects in a sequence of ``length`` tokens with ``spans``;
    ``text`` is the selector as written, for error messages.

    ``prompt_length`` (default ``length``) says that only the first ``prompt_length`` tokens
    are the prompt and the rest is a continuation being scored (e.g. a target name read
    token by token). Then ``LT`` is the last prompt token AND every continuation position
    (the graft follows the prediction position along the continuation); named spans and
    indices are resolved over the prompt (``-1`` is its last token); ``ALL`` and complements
    (``X^C`` = ``ALL`` minus ``X``) cover the continuation too.
    """
    prompt = _prompt_length(length, prompt_length, text)
    result: set[int] = set()
    for atom, complemented in node.terms:
        if isinstance(atom, PositionExpr):
            part = position_set(atom, length, spans, text, prompt)
        elif atom.kind == "LT":
            part = set(range(prompt - 1, length))
        elif atom.kind == "ALL":
            part = set(range(length))
        elif atom.kind == "span":
            if atom.name not in spans:
                have = ", ".join(sorted(spans)) or "none"
                raise SpecError(
                    f"position {atom.name!r} in {text!r} is not a span of this prompt "
                    f"(spans here: {have}); use one of those, LT, ALL or an index"
                )
            part = set(_span_part(sorted(spans[atom.name]), atom.part))
            if not part:
                which = f"{atom.name}[{atom.part}]" if atom.part else repr(atom.name)
                raise SpecError(
                    f"span {which} in {text!r} is empty for this prompt "
                    f"({len(spans[atom.name])} token(s) in {atom.name})"
                )
            bad = [p for p in part if not 0 <= p < prompt]
            if bad:
                raise SpecError(f"span {atom.name!r} has positions {bad} outside 0..{prompt - 1}")
        else:
            lo, hi = atom.start, atom.stop if atom.kind == "range" else atom.start
            lo, hi = (lo + prompt if lo < 0 else lo), (hi + prompt if hi < 0 else hi)
            if not (0 <= lo < prompt and 0 <= hi < prompt) or lo > hi:
                raise SpecError(
                    f"position {_format_term(atom, False)!r} in {text!r} is out of range for "
                    f"a prompt of {prompt} tokens"
                )
            part = set(range(lo, hi + 1))
        if complemented:
            part = set(range(length)) - part
        result |= part
    return result


def _prompt_length(length: int, prompt_length: int | None, text: str) -> int:
    """``prompt_length`` checked against ``length`` (``length`` when None)."""
    if prompt_length is None:
        return length
    if not 1 <= prompt_length <= length:
        raise SpecError(
            f"positions {text!r}: prompt_length {prompt_length} must be between 1 and the "
            f"row's {length} tokens"
        )
    return prompt_length


# -------------------------------------------------------------------------------- layers


def _parse_layer_item(item: str, text: str) -> LayerItem:
    item = item.strip()
    if item == "all":
        return ("frac", 1, 1)
    if item == "from_middle":  # layers L // 2 .. L - 1, under either rule
        return ("from_middle", 0, 0)
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
        letter, n = m.group(1), _NAMED_FRACTIONS[m.group(1)]
        return _fraction(item, text, int(m.group(2)), n, f"{letter}1..{letter}{n}")
    m = re.fullmatch(r"(\d+)/(\d+)", item)
    if m:
        return _fraction(item, text, int(m.group(1)), int(m.group(2)), "need 1 <= k <= n in k/n")
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
        "k/n, from_middle, a layer index or a range i-j"
    )


def _fraction(item: str, text: str, k: int, n: int, allowed: str) -> LayerItem:
    """The k-th of n groups, after checking ``1 <= k <= n`` (``allowed`` says so on error)."""
    if not 1 <= k <= n:
        raise SpecError(f"layer group {item!r} in {text!r}: {allowed}")
    return ("frac", k, n)


def parse_layers(text: str) -> tuple[LayerItem, ...]:
    """Parse a layer selector such as ``all``, ``q4``, ``3-7`` or ``0,2``."""
    _refuse_long_numbers(text, "layer")
    return tuple(_parse_layer_item(item, text) for item in text.split(","))


def layer_group(k: int, n: int, n_layers: int) -> list[int]:
    """Layers of the k-th (1-based) of n equal groups of an ``n_layers``-layer model."""
    return list(range(((k - 1) * n_layers) // n, (k * n_layers) // n))


def paper_layer_group(k: int, n: int, n_layers: int) -> list[int]:
    """Layers of the k-th of n groups by the paper's rule (``q = n_layers // 4``; see the
    module docstring): n = 1 (all layers), 2 (halves) or 4 (quarters).

    Raises:
        SpecError: any other n (the paper's eighths were broken; it had no other groups).
    """
    q = n_layers // 4
    bounds = {1: [0, n_layers], 2: [0, 2 * q, n_layers], 4: [0, q, 2 * q, 3 * q, n_layers]}
    if n not in bounds:
        raise SpecError(
            f"layer group {k}/{n}: the paper's layer rule has halves and quarters only (its "
            "code's eighths were broken); use h1/h2, q1..q4, explicit layers i-j, or graft's "
            "layer rule"
        )
    return list(range(bounds[n][k - 1], bounds[n][k]))


#: Layer-group rules: name -> function (k, n, n_layers) -> layers.
LAYER_RULES = {"graft": layer_group, "paper": paper_layer_group}


def layer_list(
    items: tuple[LayerItem, ...], n_layers: int, text: str, rule: str = "graft"
) -> list[int]:
    """Layers (sorted) ``items`` select in a model of ``n_layers`` layers; ``text`` is the
    selector as written, for error messages; ``rule`` names the layer-group rule of
    :data:`LAYER_RULES` (``graft`` or ``paper``)."""
    if rule not in LAYER_RULES:
        raise SpecError(f"layer rule {rule!r} unknown: use {' or '.join(LAYER_RULES)}")
    group_of = LAYER_RULES[rule]
    layers: set[int] = set()
    for kind, a, b in items:
        if kind == "frac":
            group = group_of(a, b, n_layers)
            if not group:
                raise SpecError(
                    f"layer group {a}/{b} in {text!r} is empty for a model with {n_layers} "
                    f"layers{' by the paper rule' if rule == 'paper' else ''}"
                )
            layers.update(group)
        elif kind == "from_middle":
            layers.update(range(n_layers // 2, n_layers))
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
