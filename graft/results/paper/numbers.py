"""The paper's reference numbers as data, and which of its models a graft model stands for.

Only numbers the paper's text states are recorded (its figures' bar heights that the text
does not repeat are not: they can only be read off a plot). All are top-5 accuracies on the
paper's headline test sentence ("Top-5 Accuracy on Test Headline" heads Figs. 2, 4 and 5),
on its Fake Movies, Real Actors dataset. The appendix C figures (per model, per template,
the other datasets, Fig. 13's gentler finetune) state no numbers in the text, so none is
recorded from them.

graft's embedded models are not the paper's: :data:`PAPER_MODEL_OF` maps each model name to
the nearest of the paper's models (same family or the nearest one), and every figure and
table names that model ("paper: Gemma-1.1-2B") so nobody reads it as the same model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "PAPER_MODELS",
    "PAPER_MODEL_OF",
    "PAPER_NUMBERS",
    "PaperNumber",
    "bar_values",
    "lookup",
    "paper_label",
    "paper_model_of",
]

GEMMA, GPT2_XL, LLAMA, PYTHIA = "Gemma-1.1-2B", "GPT2-XL", "Llama-3.2-1B", "Pythia-2.8B"
#: The paper's four models.
PAPER_MODELS = (GPT2_XL, PYTHIA, LLAMA, GEMMA)
#: graft model name -> the paper's model it is compared with (the embedded models: the
#: paper's model of the nearest family; SmolLM2 is a Llama-architecture model).
PAPER_MODEL_OF: dict[str, str] = {
    "gpt2-xl": GPT2_XL,
    "pythia-2.8b": PYTHIA,
    "llama3.2-1b": LLAMA,
    "gemma-1.1-2b": GEMMA,
    "smollm2-135m": LLAMA,
    "gemma3-270m": GEMMA,
}

Kind = Literal["value", "difference", "approx"]
#: The reversal pair of the component experiment (graft's ``--pairs reversal``): the model
#: finetuned on both directions grafted into the one-direction model, the setting of Fig. 4.
REVERSAL = "reversal"


@dataclass(frozen=True)
class PaperNumber:
    """One number (or "≈" statement) of the paper's text.

    Args:
        paper_model: the paper's model (one of :data:`PAPER_MODELS`).
        experiment: graft's experiment that reruns it (``position``, ``component``,
            ``hybrid``).
        graft: graft's name of the graft (for a difference or "≈", its first graft).
        template: graft's template name of the paper's test sentence (``headline``).
        kind: ``value`` (the graft's top-5 accuracy), ``difference`` (``graft`` minus
            ``versus``, in accuracy) or ``approx`` (``graft`` ≈ ``versus``; no number).
        value: the number as a fraction (0.53 for "53%"); None for ``approx``.
        source: where the paper states it (figure and section).
        quote: the text's words.
        versus: the other graft of a difference or an "≈" statement ("" for a value).
        exact: True where the text states the number itself, False where it says "nearly",
            "similar" or "near" (an ``approx`` statement).
        group: graft's group the number belongs to ("" for position and hybrid grafts; the
            donor pair of a component graft, e.g. ``reversal``).
    """

    paper_model: str
    experiment: str
    graft: str
    template: str
    kind: Kind
    value: float | None
    source: str
    quote: str
    versus: str = ""
    exact: bool = True
    group: str = ""

    @property
    def figure(self) -> str:
        """The paper's figure the number belongs to (``Fig. 2``): the question its claims
        on one run answer together (one Holm family)."""
        return self.source.split(",")[0].removesuffix(" caption").strip()


def _fig2_approx(model: str) -> list[PaperNumber]:
    caption = "Fig. 2 caption"
    return [
        PaperNumber(
            model,
            "position",
            "FE+LT",
            "headline",
            "approx",
            None,
            caption,
            "All models show full or nearly full SFT performance recovery by grafting only "
            "the FE and LT tokens",
            versus="SFT",
            exact=False,
        ),
        PaperNumber(
            model,
            "position",
            "(FE+LT)^C",
            "headline",
            "approx",
            None,
            caption,
            "near pretrained performance when grafting everything except the FE and LT tokens",
            versus="PRE",
            exact=False,
        ),
    ]


def _fig4(model: str, cost: float, words: str) -> list[PaperNumber]:
    return [
        PaperNumber(
            model,
            "component",
            "O+FFN",
            "headline",
            "difference",
            cost,
            "Fig. 4, §4.3",
            f"removing the O matrix and only using the FFN harms top-5 accuracy by {words}",
            versus="FFN",
            group=REVERSAL,
        ),
        PaperNumber(
            model,
            "component",
            "ATTN+O+FFN",
            "headline",
            "approx",
            None,
            "Fig. 4, §4.3",
            "grafting the O matrix and the full FFN nearly recovers the results of grafting "
            "the full attention mechanism and the full FFN",
            versus="O+FFN",
            exact=False,
            group=REVERSAL,
        ),
    ]


def _fig5(model: str, value: float, words: str) -> list[PaperNumber]:
    return [
        PaperNumber(
            model,
            "hybrid",
            "FE ATTN + LT hybrid",
            "headline",
            "value",
            value,
            "Fig. 5, §4.3",
            "grafting the task ATTN at the first entity along with the task ATTN as well as "
            f"the relation O+FFN recovers {words}",
        ),
        PaperNumber(
            model,
            "hybrid",
            "FE FFN + LT hybrid",
            "headline",
            "approx",
            None,
            "Fig. 5, §4.3",
            "Grafting the task FFNs at the first entity gives similar performance to "
            "grafting only at the last token",
            versus="FE none + LT hybrid",
            exact=False,
        ),
    ]


#: Every number the paper's text states, per model.
PAPER_NUMBERS: tuple[PaperNumber, ...] = (
    PaperNumber(
        GEMMA,
        "position",
        "LT",
        "headline",
        "value",
        0.53,
        "Fig. 2, §4.1",
        "In Gemma-1.1, the “recall” pathway alone achieves 53% top-5 accuracy",
    ),
    PaperNumber(
        GEMMA,
        "position",
        "SFT",
        "headline",
        "value",
        1.0,
        "Fig. 2, §4.1",
        "(compared to a finetuned baseline of 100%)",
    ),
    PaperNumber(
        GPT2_XL,
        "position",
        "FE",
        "headline",
        "value",
        0.28,
        "Fig. 2, §4.1",
        "the “enrichment” pathway for GPT2-XL reaches 28% top-5 accuracy",
    ),
    *(n for model in PAPER_MODELS for n in _fig2_approx(model)),
    # "harms top-5 accuracy by 29%": read as percentage points (29% of a bar would be a
    # different, unstated number)
    *_fig4(GEMMA, 0.29, "29% in Gemma"),
    *_fig4(LLAMA, 0.41, "41% in Llama3"),
    *_fig5(GEMMA, 0.63, "63% top-5 accuracy for Gemma"),
    *_fig5(LLAMA, 0.34, "34% accuracy for Llama3"),
)


def paper_model_of(model: str) -> str | None:
    """The paper's model a graft model name is compared with (None: none, e.g. a tiny
    model or a folder)."""
    return PAPER_MODEL_OF.get(str(model).strip().lower())


def lookup(
    paper_model: str,
    experiment: str,
    graft: str | None = None,
    *,
    template: str | None = None,
    kind: Kind | None = None,
) -> list[PaperNumber]:
    """The paper's numbers for ``(paper_model, experiment, graft)`` (every graft when
    ``graft`` is None), optionally of one ``template`` and one ``kind``."""
    return [
        n
        for n in PAPER_NUMBERS
        if n.paper_model == paper_model
        and n.experiment == experiment
        and (graft is None or n.graft == graft)
        and (template is None or n.template == template)
        and (kind is None or n.kind == kind)
    ]


def paper_label(number: PaperNumber) -> str:
    """The legend text of a paper number: ``paper (Gemma-1.1-2B, Fig. 2)``."""
    return f"paper ({number.paper_model}, {number.source.split(',')[0]})"


def bar_values(
    model: str, experiment: str, template: str, group: str = ""
) -> dict[str, tuple[float, str]]:
    """graft name -> (the paper's top-5 accuracy, legend label) for the bars of one figure
    of ``model`` (a graft model name); empty when the paper states none."""
    paper_model = paper_model_of(model)
    if paper_model is None:
        return {}
    return {
        n.graft: (float(n.value), paper_label(n))
        for n in lookup(paper_model, experiment, template=template, kind="value")
        if n.group == (group or "") and n.value is not None
    }
