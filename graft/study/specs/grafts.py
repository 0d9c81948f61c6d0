"""Named grafts: the :class:`NamedGraft` of an experiment and the paper's grafts, built from specs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from graft.core.families.arch import FAMILIES
from graft.core.language.selectors import parse_layers
from graft.core.language.spec import DEFAULT_DONOR, GraftSpec, parse_spec
from graft.errors import ExperimentError, SpecError
from graft.models import HUB_MODELS
from graft.models.configs import model_config
from graft.study.specs.choices import POSITIONS
from graft.study.specs.protocol import GRAFT, Protocol


@dataclass
class NamedGraft:
    """A named graft of an experiment.

    Args:
        name: label in tables and plots (e.g. ``FE+LT``, ``PRE``).
        spec: the graft spec.
        group: optional extra grouping (e.g. the donor pair of a component experiment).
    """

    name: str
    spec: GraftSpec
    group: str = ""


#: Fig. 4 / C.5 component sets (the paper's ATTN = qkv = q,k,v; FFN = gate,up,down).
COMPONENT_SETS = {
    "ATTN+O+FFN": "qkv,o,ffn",
    "ATTN+O": "qkv,o",
    "O+FFN": "o,ffn",
    "ATTN+FFN": "qkv,ffn",
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
    "ATTN": "qkv",
    "FFN": "ffn",
    "O+FFN": "o,ffn",
    "ATTN+O": "qkv,o",
}


def head_suffix(policy: str, donor: str = DEFAULT_DONOR) -> str:
    """The spec text that sets the head policy (``base``: none, ``donor``: the head of
    ``donor``, ``paper``), to append to a spec."""
    if policy == "base":
        return ""
    return f"; head=donor@{donor}" if policy == "donor" else "; head=paper"


def reference(name: str, donor: str | None) -> NamedGraft:
    """PRE/SFT-style reference: the base alone, or the whole donor incl. its head."""
    text = "none" if donor is None else f"ALL:all:all@{donor}; head=donor@{donor}"
    return NamedGraft(name, parse_spec(text))


def _is_reference(graft: NamedGraft) -> bool:
    """The base alone, or a whole donor with its own head (what :func:`reference` makes)."""
    spec = graft.spec
    if not spec.rules:
        return True
    whole = [(r.positions, r.layers, r.components) for r in spec.rules] == [
        ("ALL", "all", ("all",))
    ]
    return whole and spec.head == "donor" and spec.head_donor == spec.rules[0].donor


def with_protocol(grafts: Sequence[NamedGraft], protocol: Protocol = GRAFT) -> list[NamedGraft]:
    """``grafts`` resolved under ``protocol`` (``paper``: the paper's layer groups, ``all``
    without ``pos_embed``; see :mod:`graft.core.language.spec`). References stay as they are: a
    whole donor is that model, position embedding included."""
    name = protocol.name
    return [
        g if _is_reference(g) else NamedGraft(g.name, replace(g.spec, protocol=name), g.group)
        for g in grafts
    ]


def position_grafts(
    positions: Sequence[str] = POSITIONS,
    head_policy: str = "base",
    donor: str = DEFAULT_DONOR,
    base_name: str = "PRE",
    donor_name: str = "SFT",
    protocol: Protocol = GRAFT,
) -> list[NamedGraft]:
    """E1/E2: every component in every layer at each position set, plus the two references;
    ``protocol="paper"`` resolves them as the paper did (:func:`with_protocol`)."""
    grafts = [reference(base_name, None), reference(donor_name, donor)]
    for pos in positions:
        spec = parse_spec(f"{pos}:all:all@{donor}{head_suffix(head_policy, donor)}")
        grafts.append(NamedGraft(pos, spec))
    return with_protocol(grafts, protocol)


def component_grafts(
    layers: str = "q4",
    head_policy: str = "base",
    split_qkv: bool = False,
    group: str = "",
    fe: str | None = None,
    protocol: Protocol = GRAFT,
) -> list[NamedGraft]:
    """E3: component sets at the last token over a layer group, plus PRE/SFT references.

    ``fe`` (components, e.g. ``"all"``) also grafts the first entity in every layer, in every
    graft and in an extra ``FE only`` reference, so LT components are measured with the
    enrichment at FE in place (on small models LT alone recovers nothing). ``protocol``: as
    for :func:`position_grafts`.
    """
    sets = dict(COMPONENT_SETS) | (QKV_SETS if split_qkv else {})
    grafts = [
        NamedGraft("PRE", parse_spec("none"), group),
        NamedGraft("SFT", reference("SFT", DEFAULT_DONOR).spec, group),
    ]
    prefix = f"FE:all:{fe}; " if fe else ""
    if fe:
        grafts.append(
            NamedGraft(f"FE {fe} only", parse_spec(f"FE:all:{fe}{head_suffix(head_policy)}"), group)
        )
    for name, comps in sets.items():
        spec = parse_spec(f"{prefix}LT:{layers}:{comps}{head_suffix(head_policy)}")
        grafts.append(NamedGraft(name, spec, group))
    return with_protocol(grafts, protocol)


def hybrid_lt(lt_layers: str | None = None, protocol: Protocol = GRAFT) -> str:
    """The LT rules of the E4 hybrid. graft: ATTN from the task model, O and the whole FFN
    (gate, up, down) from the relation model, in the last half (``h2``). paper: the relation
    model gives O, up and down only; the gate stays the task model's (the task rule takes the
    whole FFN and the later relation rule overrides up and down, which also holds on GPT-2,
    without a gate), from layer ``L // 2`` on (``from_middle``: the authors' hybrid split,
    not their sweeps' ``2 * (L // 4)`` half). ``lt_layers`` overrides the layers."""
    proto = protocol
    lt_layers = lt_layers or proto.hybrid_layers
    if proto.hybrid_gate == "task":
        return f"LT:{lt_layers}:qkv,ffn@task; LT:{lt_layers}:o,up,down@relation"
    return f"LT:{lt_layers}:qkv@task; LT:{lt_layers}:o,ffn@relation"


def hybrid_grafts(
    lt_layers: str | None = None, head_policy: str = "base", protocol: Protocol = GRAFT
) -> list[NamedGraft]:
    """E4: task ATTN + relation O+FFN at LT (last half), FE variants from the task model;
    ``protocol="paper"``: the gate from the task model (:func:`hybrid_lt`) and the paper's
    layer groups (:func:`with_protocol`)."""
    grafts = [
        reference("PRE", None),
        reference("TASK", "task"),
        reference("RELATION", "relation"),
    ]
    lt = hybrid_lt(lt_layers, protocol)
    for name, comps in HYBRID_FE.items():
        fe = f"FE:all:{comps}@task; " if comps else ""
        spec = parse_spec(f"{fe}{lt}{head_suffix(head_policy, 'relation')}")
        grafts.append(NamedGraft(f"FE {name} + LT hybrid", spec))
    return with_protocol(grafts, protocol)


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
    width = int(windows) if windows.isdigit() else 0
    if width < 1:
        raise ExperimentError(
            f"layer windows {windows!r}: use halves, quarters, eighths, single or a width >= 1"
        )
    return [f"{s}-{min(s + width, n_layers) - 1}" for s in range(0, n_layers, width)]


def necessity_grafts(
    positions: Sequence[str] = POSITIONS,
    head_policy: str = "base",
    protocol: Protocol = GRAFT,
) -> list[NamedGraft]:
    """The other direction: PRE weights grafted into SFT at the same positions."""
    return position_grafts(
        positions, head_policy, donor="pre", base_name="SFT", donor_name="PRE", protocol=protocol
    )


def spec_graft(text: str, head_policy: str = "base", protocol: Protocol = GRAFT) -> NamedGraft:
    """``NAME=SPEC`` or ``SPEC`` (named by its text) from the command line.

    ``head_policy`` and ``protocol`` are the run's defaults: a spec that writes no ``head=``
    gets ``head_policy`` (:func:`head_suffix`), one that writes no ``protocol=`` is resolved
    under ``protocol`` (:func:`with_protocol`; a whole donor with its head stays that
    model). What the spec writes itself wins.
    """
    name, sep, spec = text.partition("=")
    if sep and not name.strip():
        raise SpecError(f"{text!r}: the name before '=' is empty; write NAME=SPEC or just SPEC")
    # "head=donor; ..." and "none; head=donor" are specs, not NAME=SPEC
    named = sep and not any(c in name for c in ":;") and name.strip() != "head"
    label, spec_name = (name.strip(), name.strip()) if named else (text.strip(), None)
    spec = spec if named else text
    parts = [p.strip() for p in spec.split(";")]
    if spec.strip() and not any(p.startswith("head=") for p in parts):
        spec += head_suffix(head_policy)  # an empty spec stays empty: parse refuses it
    graft = NamedGraft(label, GraftSpec.parse(spec, spec_name))
    if any(p.startswith("protocol=") for p in parts):
        return graft
    return with_protocol([graft], protocol)[0]


def check_layer_rule(selector: str, protocol: Protocol = GRAFT) -> None:
    """Refuse a layer selector ``protocol``'s layer rule cannot resolve on any model: the
    paper's rule has halves and quarters only (its code's eighths were broken). What depends
    on the model (a range past its last layer, an empty group) is checked when a run starts.

    Raises:
        SpecError: the selector does not parse, or names a group the rule lacks.
    """
    resolution = protocol.resolution
    for kind, k, n in parse_layers(selector):
        if kind == "frac":
            resolution.check_group(k, n)


#: The note a paper-protocol run gives wherever q, k or v is grafted on its own.
FUSED_QKV_NOTE = (
    "under the paper's protocol, on fused-QKV models (GPT-2, Pythia) 'q' grafts the whole "
    "fused projection (q, k and v) and 'k' or 'v' alone graft nothing, as the paper's code "
    "did; graft's own protocol grafts exact q/k/v slices"
)


def protocol_notes(grafts: Sequence[NamedGraft], protocol: Protocol = GRAFT) -> list[str]:
    """What of the paper's protocol a run of ``grafts`` does not reproduce, one line each
    (empty under graft's protocol): today the fused q/k/v targets, when a graft names ``q``,
    ``k`` or ``v`` on its own (``qkv``, ``attn``, ``block`` and ``all`` graft all three either way)."""
    if not protocol.fused_qkv_note:
        return []
    single = {"q", "k", "v"}
    named = any(single & set(r.components) for g in grafts for r in g.spec.rules)
    return [FUSED_QKV_NOTE] if named else []


@dataclass(frozen=True)
class PaperDefault:
    """The graft the paper's token tables (C.7) show for one of its models.

    Args:
        paper_model: the paper's model the table is of.
        section: the table's section of the paper.
        positions: the positions grafted (in every layer, every component).
    """

    paper_model: str
    section: str
    positions: str


#: graft family -> the paper's token-table graft of that family's model (C.7.1-C.7.3).
PAPER_TOKEN_GRAFTS: dict[str, PaperDefault] = {
    "llama": PaperDefault("llama3.2-1b", "C.7.1", "FE^C"),
    "gemma": PaperDefault("gemma-1.1-2b", "C.7.2", "LT"),
    "gpt2": PaperDefault("gpt2-xl", "C.7.3", "(FE+LT)^C"),
}
#: Families without a token table -> the nearest family with one: Pythia goes with GPT2-XL
#: (the paper groups the two: weak last-token recall, a strong first-entity pathway), later
#: Gemmas with Gemma, Qwen (a Llama-like layout) with Llama.
NEAREST_PAPER_FAMILY = {
    "gpt_neox": "gpt2",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "qwen2": "llama",
    "qwen3": "llama",
}


def paper_token_graft(
    model: str, head_policy: str = "base", protocol: Protocol = GRAFT
) -> tuple[NamedGraft, str]:
    """The paper's token-table graft for ``model`` (a model name, hub id or folder), in every
    layer and component, and a line saying which table it follows and, for a model the
    paper has no table of, that it is the nearest family's.

    Raises:
        ExperimentError: the model's config is not on this machine, or of no family graft
            knows (name the grafts with specs instead).
    """
    found = model_config(model)
    model_type = None if found is None else getattr(found.config, "model_type", None)
    family = next((f for f in FAMILIES.values() if model_type in f.model_types), None)
    if family is None:
        why = "has no config on this machine" if found is None else f"is of type {model_type!r}"
        raise ExperimentError(
            f"cannot choose the paper's graft: {model} {why}, of no family graft knows; "
            "give the grafts as specs instead",
            param="grafts",
        )
    nearest = NEAREST_PAPER_FAMILY.get(family.name, family.name)
    default = PAPER_TOKEN_GRAFTS[nearest]
    graft = spec_graft(f"{default.positions}={default.positions}:all:all", head_policy, protocol)
    line = (
        f"{model} ({family.name} family) takes the paper's {default.positions} graft, its "
        f"token table of {default.paper_model} ({default.section})"
    )
    if model not in (default.paper_model, HUB_MODELS[default.paper_model]):
        line += f"; the paper has no token table of {model}: {default.paper_model}'s is the nearest"
    return graft, line
