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

#: public name -> the module that defines it (imported on first access).
_EXPORTS = {
    "Architecture": "graft.core.families.arch",
    "architecture_of": "graft.core.families.arch",
    "run_grafts": "graft.core.execution.engine",
    "score_grafts": "graft.core.execution.engine",
    "Executor": "graft.core.execution.executor",
    "LocalExecutor": "graft.core.execution.executor",
    "GraftRow": "graft.core.planning.plan",
    "default_pad_id": "graft.core.planning.plan",
    "cache_argument": "graft.core.planning.prefix",
    "COUNT": "graft.ranges",
    "Range": "graft.ranges",
    "SEED": "graft.ranges",
    "engine_path": "graft.core.execution.routing",
    "render": "graft.core.language.spans",
    "tokenize_with_spans": "graft.core.language.spans",
    "EMBEDDING_COMPONENTS": "graft.core.language.spec",
    "GraftSpec": "graft.core.language.spec",
    "HEAD_POLICIES": "graft.core.language.spec",
    "PROTOCOLS": "graft.core.language.spec",
    "ResolvedGraft": "graft.core.language.spec",
    "parse_spec": "graft.core.language.spec",
    "SMOKE_SPECS": "graft.core.api.selfcheck",
    "TOLERANCE": "graft.core.api.selfcheck",
    "check_family": "graft.core.api.selfcheck",
    "path_word": "graft.core.api.selfcheck",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
