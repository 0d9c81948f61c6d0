"""Public names imported on first use: how ``graft`` and its packages export what their
modules define without importing torch, nnsight or transformers before they are needed."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, Sequence[str]], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``__getattr__``, ``__dir__`` and ``__all__`` for ``package``: ``exports`` maps a module
    to the public names it defines (``"name=attr"`` where the module calls it ``attr``); a
    name is imported on first access and kept in ``namespace`` (the package's globals)."""
    where: dict[str, tuple[str, str]] = {}
    for module, names in exports.items():
        for entry in names:
            name, _, attr = entry.partition("=")
            where[name] = (module, attr or name)

    def getattr_(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attr = where[name]
        value = getattr(importlib.import_module(module), attr)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted([*namespace, *where])

    return getattr_, dir_, sorted(where)
