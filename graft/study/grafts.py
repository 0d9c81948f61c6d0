"""The named grafts of the paper's experiments (DESIGN.md §2), built from graft specs."""

from __future__ import annotations

from graft.core.spec import GraftSpec, SpecError, parse_spec
from graft.study.runner import Graft

#: Fig. 2 / Fig. 3a positions; M and R variants apply only to templates with those fields.
POSITIONS = (
    "FE",
    "LT",
    "FE+LT",
    "(FE+LT)^C",
    "FE^C",
    "LT^C",
    "M",
    "FE+M",
    "M+LT",
    "R",
    "FE+R",
    "R+LT",
)
#: Fig. 4 / C.5 component sets (ATTN = q,k,v; FFN = gate,up,down).
COMPONENT_SETS = {
    "ATTN+O+FFN": "attn,o,ffn",
    "ATTN+O": "attn,o",
    "O+FFN": "o,ffn",
    "ATTN+FFN": "attn,ffn",
    "O": "o",
    "FFN": "ffn",
    "O+FFN_up": "o,ffn_up",
    "O+FFN_down": "o,ffn_down",
}
#: What the paper's code could not graft on fused-QKV models: q, k, v one at a time.
QKV_SETS = {"Q": "q", "K": "k", "V": "v", "Q+K": "q,k"}
#: Fig. 5 first-entity variants, all from the task model in every layer.
HYBRID_FE = {
    "none": None,
    "all": "all",
    "ATTN": "attn",
    "FFN": "ffn",
    "O+FFN": "o,ffn",
    "ATTN+O": "attn,o",
}


def _head(policy: str, donor: str = "sft") -> str:
    if policy == "base":
        return ""
    return f"; head=donor@{donor}" if policy == "donor" else "; head=paper"


def reference(name: str, donor: str | None) -> Graft:
    """PRE/SFT-style reference: the base alone, or the whole donor incl. its head."""
    text = "none" if donor is None else f"ALL:all:all@{donor}; head=donor@{donor}"
    return Graft(name, parse_spec(text))


def position_grafts(
    positions=POSITIONS,
    head_policy: str = "base",
    donor: str = "sft",
    base_name: str = "PRE",
    donor_name: str = "SFT",
) -> list[Graft]:
    """E1/E2: every component in every layer at each position set, plus the two references."""
    grafts = [reference(base_name, None), reference(donor_name, donor)]
    for pos in positions:
        spec = parse_spec(f"{pos}:all:all@{donor}{_head(head_policy, donor)}")
        grafts.append(Graft(pos, spec))
    return grafts


def component_grafts(
    layers: str = "q4",
    head_policy: str = "base",
    split_qkv: bool = False,
    group: str = "",
    fe: str | None = None,
) -> list[Graft]:
    """E3: component sets at the last token over a layer group, plus PRE/SFT references.

    ``fe`` (components, e.g. ``"all"``) also grafts the first entity in every layer, in every
    graft and in an extra ``FE only`` reference, so LT components are measured with the
    enrichment at FE in place (on small models LT alone recovers nothing).
    """
    sets = dict(COMPONENT_SETS) | (QKV_SETS if split_qkv else {})
    grafts = [
        Graft("PRE", parse_spec("none"), group),
        Graft("SFT", reference("SFT", "sft").spec, group),
    ]
    prefix = f"FE:all:{fe}; " if fe else ""
    if fe:
        grafts.append(Graft(f"FE {fe} only", parse_spec(f"FE:all:{fe}{_head(head_policy)}"), group))
    for name, comps in sets.items():
        spec = parse_spec(f"{prefix}LT:{layers}:{comps}{_head(head_policy)}")
        grafts.append(Graft(name, spec, group))
    return grafts


def hybrid_grafts(lt_layers: str = "h2", head_policy: str = "base") -> list[Graft]:
    """E4: task ATTN + relation O+FFN at LT (last half), FE variants from the task model."""
    grafts = [
        reference("PRE", None),
        reference("TASK", "task"),
        reference("RELATION", "relation"),
    ]
    lt = f"LT:{lt_layers}:attn@task; LT:{lt_layers}:o,ffn@relation"
    for name, comps in HYBRID_FE.items():
        fe = f"FE:all:{comps}@task; " if comps else ""
        spec = parse_spec(f"{fe}{lt}{_head(head_policy, 'relation')}")
        grafts.append(Graft(f"FE {name} + LT hybrid", spec))
    return grafts


def layer_windows(n_layers: int, windows: str) -> list[str]:
    """Layer selectors of a localisation map: halves, quarters, eighths, single, or a width K."""
    named = {"halves": ("h", 2), "quarters": ("q", 4), "eighths": ("e", 8)}
    if windows in named:
        prefix, n = named[windows]
        if n_layers < n:
            return [str(i) for i in range(n_layers)]
        return [f"{prefix}{k}" for k in range(1, n + 1)]
    if windows == "single":
        return [str(i) for i in range(n_layers)]
    width = int(windows)
    if width < 1:
        raise ValueError("window width must be >= 1")
    return [f"{s}-{min(s + width, n_layers) - 1}" for s in range(0, n_layers, width)]


def necessity_grafts(positions=POSITIONS, head_policy: str = "base") -> list[Graft]:
    """The other direction: PRE weights grafted into SFT at the same positions."""
    return position_grafts(positions, head_policy, donor="pre", base_name="SFT", donor_name="PRE")


def spec_graft(text: str) -> Graft:
    """``NAME=SPEC`` or ``SPEC`` (named by its text) from the command line."""
    name, sep, spec = text.partition("=")
    if sep and not name.strip():
        raise SpecError(f"{text!r}: the name before '=' is empty; write NAME=SPEC or just SPEC")
    # "head=donor; ..." and "none; head=donor" are specs, not NAME=SPEC
    if sep and not any(c in name for c in ":;") and name.strip() != "head":
        return Graft(name.strip(), GraftSpec.parse(spec, name.strip()))
    return Graft(text.strip(), GraftSpec.parse(text))
