"""Running grafts on an NDIF server: config, payload accounting, the nnsight client, the
remote executor, hosted graft pairs."""

from graft.lazy import lazy_exports

#: public name -> the module that defines it (imported on first access).
_EXPORTS = {
    "DONOR_MODES": "graft.remote.config",
    "REMOTE_RANGES": "graft.remote.config",
    "RemoteConfig": "graft.remote.config",
    "RemoteExecutor": "graft.remote.executor",
    "payload_table": "graft.remote.payload",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
