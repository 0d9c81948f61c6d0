"""Storage: files that are either whole or absent (atomic writes), cross-process locks, and
tables that carry their provenance in their metadata. Imports only :mod:`graft.errors`."""

from graft.lazy import lazy_exports

#: public name -> the module that defines it (imported on first access).
_EXPORTS = {
    "atomic_path": "graft.storage.files",
    "write_csv": "graft.storage.tables",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
