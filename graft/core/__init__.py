"""The grafting engine and what it stands on, in five rooms, lowest first (each imports only
those below it; a contract in pyproject.toml). Imports nothing of graft above it.

- ``families``: the model families graft supports: one table per family of its sites in
  forward order (:mod:`graft.core.families.arch`), and the nnsight wrapper a model is
  traced with (:mod:`graft.core.families.wrapping`);
- ``language``: the spec language: specs and their resolution on a model
  (:mod:`graft.core.language.spec`), position and layer selectors, the component
  vocabulary and the protocols' rules, :class:`~graft.core.language.graft_object.Graft`,
  and the named spans of a prompt in tokens (:mod:`graft.core.language.spans`);
- ``planning``: rows into batch plans before any model runs: per-site masks, the layouts
  kept across calls, the steps on shared prefixes, which model carries a row;
- ``execution``: running the plans: the one loop
  (:func:`~graft.core.execution.engine.run_grafts`) and what it accepts, the routing of
  rows, the executors, the code that runs inside a trace, the traceless graft, the head's
  buffers, layers shared by identical rows;
- ``api``: the entry points on the engine: ``graft_texts`` and ``score_targets`` on text
  prompts, whole-continuation scoring, ``graft.generate``, ``graft.trace`` (the graft as an
  nnsight trace) and the engine's self-check.

Tiny random models live in :mod:`graft.models.tiny` (a layer above); numeric ranges in
:mod:`graft.ranges` (re-exported here).
"""

from graft.lazy import lazy_exports

#: module -> the public names it defines (each imported on first access; ``name=attr``
#: where the module calls it otherwise).
_EXPORTS = {
    "graft.core.families.arch": ("Architecture", "architecture_of"),
    "graft.core.execution.engine": ("run_grafts", "score_grafts"),
    "graft.core.execution.executor": ("Executor", "LocalExecutor"),
    "graft.core.planning.plan": ("GraftRow", "default_pad_id"),
    "graft.core.planning.kv_cache": ("cache_argument",),
    "graft.ranges": ("COUNT", "Range", "SEED"),
    "graft.core.execution.routing": ("engine_path",),
    "graft.core.language.spans": ("render", "tokenize_with_spans"),
    "graft.core.language.spec": (
        "EMBEDDING_COMPONENTS",
        "GraftSpec",
        "HEAD_POLICIES",
        "PROTOCOLS",
        "ResolvedGraft",
        "parse_spec",
    ),
    "graft.core.language.vocabulary": ("ATTRIBUTION_METRICS", "DEFAULT_KINDS", "ESTIMATORS"),
    "graft.core.api.attribution_verify": ("MULTI_KINDS", "verify_attribution", "verify_multicell"),
    "graft.core.api.selfcheck": (
        "SMOKE_SPECS",
        "TOLERANCE",
        "SelfCheck",
        "check_family",
        "path_word",
        "self_check",
    ),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, globals())
