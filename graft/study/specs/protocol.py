"""The two protocols a study runs under, as objects: every choice that differs between
graft's protocol and the paper's (its code's) is a field of :class:`Protocol`, so the rest of
the study reads a field instead of comparing the protocol's name.

``graft`` is graft's own setup (its training templates and test wording, never-empty layer
groups, exact q/k/v slices, the base's head). ``paper`` reproduces what the paper's code did:
its templates and Table 1 wording, both-direction donors, the paper head policy, its layer
groups (``q = L // 4``; eighths refused), ``all`` without the learned position embedding,
``q`` as the whole fused projection on GPT-2 and Pythia, float32 grafts, the paper's
finetuning preset, 1,000 facts and its metadata ranges.
"""

from __future__ import annotations

from dataclasses import dataclass

from graft.core.language.spec import PROTOCOLS, RESOLUTIONS
from graft.core.language.vocabulary import DEFAULT_PROTOCOL, Resolution
from graft.errors import ExperimentError
from graft.study.specs.templates import TEMPLATE_SETS, TemplateSet


@dataclass(frozen=True)
class Protocol:
    """One protocol's choices.

    Args:
        name: ``graft`` or ``paper``: the value of ``--protocol``, what run records store and
            what a graft spec's ``protocol=`` names (the spec language's own resolution rules,
            :data:`graft.core.language.spec.PROTOCOLS`).
        title: how a sentence names it ("graft's protocol", "the paper's protocol").
        templates: its training and test templates
            (:class:`~graft.study.specs.templates.TemplateSet`).
        resolution: how its grafts' cells resolve (layer groups, ``all``, fused q/k/v;
            :class:`~graft.core.language.vocabulary.Resolution`).
        head_policy: the head policy of grafts that name none.
        dtype: the dtype models run in when none is given; None: the device's default
            (float32 on CPU, bfloat16 on CUDA).
        preset: the finetune preset when none is given; None: the device's default.
        donor_variant: the finetune data variant of the SFT donor by default.
        hybrid_variants: the task and relation donors' variants of E4's hybrid.
        hybrid_layers: the layers of the hybrid's last-token rules.
        hybrid_gate: the donor of the hybrid's FFN gate at the last token (``task`` or
            ``relation``).
        paper_size: a generated dataset without ``n_facts`` takes the paper's 1,000 facts
            (or every fact the kind has).
        metadata_ranges: ``(field, low, high)`` ranges of a fact's fake metadata that
            replace graft's own (1970-2024 and $2-900M); empty: graft's.
        generator_tags: what its datasets' generator version records.
        dataset_tag: the part of a dataset folder's name that keeps its datasets apart.
        run_tag: the part of a run folder's default name that keeps its runs apart.
        test_prompts_from_donor: test prompts come from the donor's own dataset (the
            both-direction one), so no second dataset is generated.
        layer_windows: E7's default layer windows.
        refused_windows: layer windows its layer rule cannot make.
        fused_qkv_note: a run that grafts q, k or v alone on fused-QKV models prints that
            they are not graft's exact slices.
    """

    name: str
    title: str
    templates: TemplateSet
    resolution: Resolution
    head_policy: str
    dtype: str | None
    preset: str | None
    donor_variant: str
    hybrid_variants: tuple[str, str]
    hybrid_layers: str
    hybrid_gate: str
    paper_size: bool
    metadata_ranges: tuple[tuple[str, int, int], ...]
    generator_tags: tuple[str, ...]
    dataset_tag: str
    run_tag: str
    test_prompts_from_donor: bool
    layer_windows: str
    refused_windows: tuple[str, ...]
    fused_qkv_note: bool


#: The protocol a run takes when it names none (the spec language's default); datasets and
#: run records write the protocol only when it is another one.
GRAFT = Protocol(
    name=DEFAULT_PROTOCOL,
    title="graft's protocol",
    templates=TEMPLATE_SETS["graft"],
    resolution=RESOLUTIONS["graft"],
    head_policy="base",
    dtype=None,
    preset=None,
    donor_variant="one",
    hybrid_variants=("task", "relation"),
    hybrid_layers="h2",
    hybrid_gate="relation",
    paper_size=False,
    metadata_ranges=(),
    generator_tags=(),
    dataset_tag="",
    run_tag="",
    test_prompts_from_donor=False,
    layer_windows="eighths",
    refused_windows=(),
    fused_qkv_note=False,
)

PAPER = Protocol(
    name="paper",
    title="the paper's protocol",
    templates=TEMPLATE_SETS["paper"],
    resolution=RESOLUTIONS["paper"],
    head_policy="paper",
    dtype="float32",  # the authors' code loaded every model in float32
    preset="paper",  # A.3.3: lr 2e-5, weight decay 0.01, batch 4, 10 epochs
    donor_variant="both",
    hybrid_variants=("both-A", "both-B"),
    hybrid_layers="from_middle",  # the authors' hybrid split the layers at L // 2
    hybrid_gate="task",
    paper_size=True,
    metadata_ranges=(("release_year", 1990, 2030), ("box_office_millions", 1, 10)),
    generator_tags=("paper-movie-in-in", "paper-5-article-5-qa"),
    dataset_tag="paper",
    run_tag="paper",
    test_prompts_from_donor=True,
    layer_windows="quarters",
    refused_windows=("eighths",),  # its code's eighths were broken
    fused_qkv_note=True,
)

#: Every protocol by name.
BY_NAME: dict[str, Protocol] = {p.name: p for p in (GRAFT, PAPER)}
assert set(BY_NAME) == set(PROTOCOLS)


def protocol_of(name: str | Protocol) -> Protocol:
    """The protocol named ``name`` (a :class:`Protocol` is returned as it is).

    Raises:
        ExperimentError: an unknown name.
    """
    if isinstance(name, Protocol):
        return name
    try:
        return BY_NAME[name]
    except (KeyError, TypeError):
        raise ExperimentError(
            f"protocol {name!r} unknown: use {' or '.join(BY_NAME)}", param="protocol"
        ) from None
