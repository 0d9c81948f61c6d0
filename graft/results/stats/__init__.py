"""Intervals and paired tests for graft's result tables (statsmodels and scipy underneath).

Every graft of a run scores the same test examples, so two grafts are compared pairwise,
example by example, rather than as two independent samples:

- a proportion (top-k accuracy of one graft): :func:`wilson_interval` or the exact
  :func:`clopper_pearson_interval`; both give an honest upper bound above 0 for 0/n;
- two grafts' hit@k on the same examples: :func:`paired_hits`, the exact (conditional)
  McNemar test on the discordant counts, with Newcombe's square-and-add interval (his
  method 10, 1998) for the difference in accuracy;
- a continuous per-example metric (log-prob, rank): :func:`paired_bootstrap`;
- one value per finetune seed: :func:`seed_summary` (mean with a Student-t interval over
  seeds) and :func:`cluster_bootstrap` (resample seeds, then examples within each seed);
- a family of tests: :func:`holm`;
- a run's table of contrasts: :func:`paired_contrasts`.

Modules: :mod:`~graft.results.stats.intervals` (statsmodels' Wilson and Clopper-Pearson,
Newcombe's paired combination, scipy's t), :mod:`~graft.results.stats.paired` (statsmodels'
McNemar and Holm, bootstraps), :mod:`~graft.results.stats.contrasts` (the table); the
verdicts against the paper's numbers: :mod:`~graft.results.stats.verdict` (a verdict as
data, and the decision), :mod:`~graft.results.stats.agreement` (one number),
:mod:`~graft.results.stats.paired_agreement` ("A ≈ B") and
:mod:`~graft.results.stats.wording` (a verdict's words).
"""

from graft.errors import StatsError
from graft.results.stats.contrasts import paired_contrasts
from graft.results.stats.intervals import (
    Interval,
    SeedSummary,
    clopper_pearson_interval,
    newcombe_paired_interval,
    seed_summary,
    wilson_interval,
)
from graft.results.stats.paired import (
    BootstrapResult,
    PairedHits,
    cluster_bootstrap,
    holm,
    mcnemar_exact_p,
    paired_bootstrap,
    paired_hits,
)

__all__ = [
    "BootstrapResult",
    "Interval",
    "PairedHits",
    "SeedSummary",
    "StatsError",
    "clopper_pearson_interval",
    "cluster_bootstrap",
    "holm",
    "mcnemar_exact_p",
    "newcombe_paired_interval",
    "paired_bootstrap",
    "paired_contrasts",
    "paired_hits",
    "seed_summary",
    "wilson_interval",
]
