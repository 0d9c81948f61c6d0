"""The names the command line offers before anything heavy loads: the data kinds, the
kinds a workspace generates, the donor variants' aliases, the default dataset size, the
position sets of E1 and the other experiments' choices."""

from __future__ import annotations

from graft.study.specs.templates import DIRECTIONS

#: Every dataset kind; ``articles`` (the user's own texts) is built by
#: :mod:`graft.study.data.articles`, ``relation`` (facts of any relation) by
#: :mod:`graft.study.data.relation`.
KINDS = (
    "fake_movies_real_actors",
    "fake_movies_fake_actors",
    "real_movies_shuffled",
    "custom",
    "articles",
    "relation",
)
DEFAULT_N_FACTS = 50
#: Facts per dataset in the paper (its default under ``protocol="paper"``, or the most a kind
#: has where it has fewer).
PAPER_N_FACTS = 1000
#: Data kinds that need the user's file (``graft-exp data`` makes their dataset folder).
FILE_KINDS = {
    "custom": "--facts FILE",
    "articles": "--articles FILE",
    "relation": "--relation FILE.toml",
}
#: Data kinds a workspace generates (the others need the user's file: give their dataset
#: folder).
GENERATED_KINDS = tuple(k for k in KINDS if k not in FILE_KINDS)
#: Variant aliases: the split dataset's fact set A is the task, B the relation.
VARIANT_ALIASES = {"task": "one-A", "relation": "one-B"}
#: Every finetune data variant: a direction, an alias, or a direction and the fact set of a
#: split dataset (:func:`graft.study.training.workspace.parse_variant` reads them).
VARIANTS = (*DIRECTIONS, *VARIANT_ALIASES, *(f"{d}-{s}" for d in DIRECTIONS for s in "AB"))

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

#: The grafts of ``tokens`` by default, after PRE and SFT.
TOKEN_SPECS = ("FE=FE:all:all", "LT=LT:all:all", "FE+LT=FE+LT:all:all")
#: The lens: the top tokens stored per (row, layer, position) unless asked otherwise.
DEFAULT_TOP_K = 5
#: The patching sweep: what ``methods`` accepts (the engine's graft, or patching the donor's
#: own values), the site kinds, the two directions, the rows of the layer x position maps
#: (the averaged rows of causal tracing, coarser) and E1's whole-depth cells, run by every
#: method beside the sweep.
METHODS = ("weights", "patching")
SITE_KINDS = ("residual", "attn", "mlp")
PATCH_MODES = ("restore", "break")
UNITS = ("FE[:-1]", "FE[-1]", "(FE+LT)^C", "LT")
WHOLE_DEPTH = ("FE", "LT", "FE+LT")
