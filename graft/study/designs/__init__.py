"""The paper's experiments as library objects: each function builds a
:class:`~graft.study.designs.design.Design` (the runs it needs, how their tables combine,
which figures it draws) from resolved specs and the experiment's own choices;
:func:`~graft.study.designs.design.run_design` runs any design with the one runner and
:func:`~graft.study.designs.design.plan_design` plans it without loading a model.

- ``design``: :class:`Design`, :class:`DesignRun`, :func:`run_design`, :func:`plan_design`;
- ``common``: what the paper's designs share (the protocol's run fields, the SFT donor's run);
- ``paper``: position (E1, E2), necessity, hybrid (E4), layers (E7), tokens (E6), custom;
- ``component``: E3 and its donor pairs;
- ``lens``: the logit lens under grafts;
- ``patching``: weight grafting beside activation patching, layer by layer;
- ``attribution``: every cell's graft effect estimated from one backward pass, the top cells
  grafted for real: no design of runs but an
  :class:`~graft.study.specs.attribution.AttributionRequest` that :func:`run_attribution`
  runs into a run folder, and the lines :func:`attribution_lines` prints of it.

Example::

    from graft.study import ExperimentConfig, resolve
    from graft.study import designs

    specs = resolve(ExperimentConfig(model="smollm2-135m", n=20))
    done = designs.run_design(designs.position(specs, positions=["FE", "LT"]), echo=print)
    done.run.summary
"""

from graft.study.designs.attribution import AttributionRun, attribution_lines, run_attribution
from graft.study.designs.component import PAIRS, DonorPair, component, donor_pairs
from graft.study.designs.design import Design, DesignRun, plan_design, run_design
from graft.study.designs.lens import LENS_SPECS, lens
from graft.study.designs.paper import (
    TOP_TOKENS,
    custom,
    hybrid,
    layers,
    necessity,
    position,
    tokens,
)
from graft.study.designs.patching import patching, run_methods, summary_lines
from graft.study.specs.choices import METHODS, TOKEN_SPECS

__all__ = [
    "AttributionRun",
    "LENS_SPECS",
    "METHODS",
    "PAIRS",
    "TOKEN_SPECS",
    "TOP_TOKENS",
    "Design",
    "DesignRun",
    "DonorPair",
    "attribution_lines",
    "component",
    "custom",
    "donor_pairs",
    "hybrid",
    "layers",
    "lens",
    "necessity",
    "patching",
    "plan_design",
    "position",
    "run_attribution",
    "run_design",
    "run_methods",
    "summary_lines",
    "tokens",
]
