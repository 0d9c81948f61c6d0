"""Running grafts on an NDIF server: config, payload accounting, the nnsight client, the
remote executor, hosted graft pairs."""

from graft.lazy import lazy_exports

#: module -> the public names it defines (each imported on first access; ``name=attr``
#: where the module calls it otherwise).
_EXPORTS = {
    "graft.remote.config": ("DONOR_MODES", "REMOTE_RANGES", "RemoteConfig"),
    "graft.remote.executor": ("RemoteExecutor",),
    "graft.remote.payload": ("payload_table",),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, globals())
