"""Storage: files that are either whole or absent (atomic writes), cross-process locks, and
tables that carry their provenance in their metadata. Imports only :mod:`graft.errors`."""

from graft.lazy import lazy_exports

#: module -> the public names it defines (each imported on first access; ``name=attr``
#: where the module calls it otherwise).
_EXPORTS = {
    "graft.storage.failures": ("uncaught_storage_error",),
    "graft.storage.files": ("atomic_path", "refuse_special_under"),
    "graft.storage.tables": ("write_csv",),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, globals())
