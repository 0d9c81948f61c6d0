"""The component vocabulary of graft specs and the protocols' resolution rules: the
component groups (``attn``, ``ffn``, ``block``, ``all``, ...), expanding a rule's component
names on a model family, fused q/k/v as the paper's code grafted it, and how a spec resolves
under each protocol (:class:`Resolution`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from graft.core.language.selectors import paper_layer_group
from graft.errors import SpecError

if TYPE_CHECKING:
    from graft.core.families.arch import Architecture


#: the kinds :func:`graft.attribute` attributes by default: the paper's components (qkv = its
#: ATTN, o, ffn) and more
DEFAULT_KINDS = ("q", "k", "v", "qkv", "o", "attn", "mlp")
#: what :func:`graft.attribute` estimates: the target's first-token log-prob, or its raw logit
ATTRIBUTION_METRICS = ("logprob", "logit")
#: how :func:`graft.attribute` estimates a cell: ``local`` (the attention block's change
#: exact, linear downstream; the default) or ``linear`` (first order in each module's output
#: change)
ESTIMATORS = ("local", "linear")


@dataclass(frozen=True)
class Resolution:
    """How a spec's cells are resolved under one protocol (``protocol=`` in a spec).

    Args:
        layer_rule: the layer groups' rule (:data:`graft.core.language.selectors.LAYER_RULES`).
        all_has_pos_embed: ``all`` includes the learned position embedding.
        fused_q_whole: on fused-QKV models ``q`` grafts the whole fused projection and ``k``
            or ``v`` alone nothing, as the paper's code did (else exact slices).
        fixed_groups: the only layer-group counts ``n`` of ``k/n`` its rule has, whatever the
            model (the paper's: 1, 2 and 4; its code's eighths were broken); empty: any.
        groups: (group, components) of the component groups it reads otherwise than
            :data:`COMPONENT_GROUPS` (the paper's ``attn`` is q, k and v).
    """

    layer_rule: str
    all_has_pos_embed: bool
    fused_q_whole: bool
    fixed_groups: tuple[int, ...] = ()
    groups: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def check_group(self, k: int, n: int) -> None:
        """Refuse ``k/n`` when the rule has no such groups on any model (a group that only
        some depths make empty is checked when the spec is resolved on a model)."""
        if self.fixed_groups:
            paper_layer_group(k, n, 4)  # raises for any n but 1, 2 and 4


#: How a spec is resolved under each protocol: graft's layer groups and ``all``, or the paper
#: code's.
RESOLUTIONS = {
    "graft": Resolution("graft", all_has_pos_embed=True, fused_q_whole=False),
    "paper": Resolution(
        "paper",
        all_has_pos_embed=False,
        fused_q_whole=True,
        fixed_groups=(1, 2, 4),
        groups=(("attn", ("q", "k", "v")),),
    ),
}
PROTOCOLS = tuple(RESOLUTIONS)
#: The protocol of a spec that names none (not written in its text or JSON).
DEFAULT_PROTOCOL = "graft"
EMBEDDING_COMPONENTS = ("embed", "pos_embed")
#: Component groups under graft's protocol. ``attn`` is the attention block as nnsight and
#: TransformerLens users read it (q, k, v, the q/k norms where a family has them, and o);
#: ``qkv`` is the paper's ATTN (q, k, v only); ``mlp`` is ``ffn``.
COMPONENT_GROUPS = {
    "attn": ("q", "k", "v", "q_norm", "k_norm", "o"),
    "qkv": ("q", "k", "v"),
    "ffn": ("gate", "up", "down"),
    "mlp": ("gate", "up", "down"),
    "ffn_up": ("gate", "up"),
    "ffn_down": ("down",),
}
#: The groups as an error message lists them.
GROUPS_HELP = (
    "groups: attn (the attention block: q, k, v, q/k norms, o; under protocol=paper q, k, v), "
    "qkv, ffn = mlp, ffn_up, ffn_down, norms, block, all"
)


def group_members(name: str, protocol: str = DEFAULT_PROTOCOL) -> tuple[str, ...]:
    """The components of group ``name`` under ``protocol`` (before a family drops those it
    lacks)."""
    return dict(RESOLUTIONS[protocol].groups).get(name) or COMPONENT_GROUPS[name]


# Every logical component any supported family has; a family may lack some
# (graft.core.families.arch).
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
SPECIAL_GROUPS = ("norms", "block", "all")


# ---------------------------------------------------------------------------- components


def expand_components(
    names: tuple[str, ...],
    available: tuple[str, ...],
    family: str,
    protocol: str = DEFAULT_PROTOCOL,
) -> list[str]:
    """Expand groups and check every name exists for ``family`` (whose components are
    ``available``). Under ``protocol="paper"``, ``all`` leaves out ``pos_embed``."""
    out: list[str] = []
    layer_components = [c for c in available if c not in EMBEDDING_COMPONENTS]
    for name in names:
        if name == "all":
            keep_pos = RESOLUTIONS[protocol].all_has_pos_embed
            expanded = [c for c in available if keep_pos or c != "pos_embed"]
        elif name == "block":
            expanded = layer_components
        elif name == "norms":
            expanded = [c for c in layer_components if c.startswith("ln_") or c.endswith("_norm")]
        elif name in COMPONENT_GROUPS:
            # a group takes the members this family has (GPT-2 has no gate)
            expanded = [c for c in group_members(name, protocol) if c in available]
        elif name in available:
            expanded = [name]
        else:
            raise SpecError(
                f"component {name!r} does not exist in the {family} family; it has: "
                f"{', '.join(available)} ({GROUPS_HELP})"
            )
        out.extend(c for c in expanded if c not in out)
    return out


def fused_qkv(arch: Architecture) -> bool:
    """Whether ``arch`` computes q, k and v in one fused projection (GPT-2, GPT-NeoX)."""
    return any(site.fused for site in arch.table.layer_sites if "q" in site.components)


def paper_fused_qkv(components: list[str]) -> list[str]:
    """Components as the paper's code grafts them on a fused q/k/v projection: its ``q`` is
    the whole projection (q, k and v), and ``k`` and ``v`` graft nothing."""
    out = [c for c in components if c not in ("k", "v")]
    if "q" in out:
        at = out.index("q")
        out[at : at + 1] = ["q", "k", "v"]
    return out
