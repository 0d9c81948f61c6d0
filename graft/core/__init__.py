"""The grafting engine and what it stands on: the spec language, the family tables, batch
plans, the trace code, the execution loop, token spans, tiny models. Imports nothing of
graft above it."""

from graft.lazy import lazy_exports

#: public name -> the module that defines it (imported on first access).
_EXPORTS = {
    "Architecture": "graft.core.arch",
    "architecture_of": "graft.core.arch",
    "run_grafts": "graft.core.engine",
    "LocalExecutor": "graft.core.executor",
    "GraftRow": "graft.core.plan",
    "default_pad_id": "graft.core.plan",
    "cache_argument": "graft.core.prefix",
    "COUNT": "graft.core.ranges",
    "Range": "graft.core.ranges",
    "SEED": "graft.core.ranges",
    "engine_path": "graft.core.routing",
    "render": "graft.core.spans",
    "tokenize_with_spans": "graft.core.spans",
    "EMBEDDING_COMPONENTS": "graft.core.spec",
    "GraftSpec": "graft.core.spec",
    "HEAD_POLICIES": "graft.core.spec",
    "PROTOCOLS": "graft.core.spec",
    "ResolvedGraft": "graft.core.spec",
    "parse_spec": "graft.core.spec",
    "SMOKE_SPECS": "graft.core.selfcheck",
    "TOLERANCE": "graft.core.selfcheck",
    "check_family": "graft.core.selfcheck",
    "path_word": "graft.core.selfcheck",
    "TINY_FAMILIES": "graft.core.tiny",
    "perturbed_copy": "graft.core.tiny",
    "tiny_model": "graft.core.tiny",
    "tiny_pair": "graft.core.tiny",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
