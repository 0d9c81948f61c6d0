"""Public names imported on first use: how ``graft`` and its packages export what their
modules define without importing torch, nnsight or transformers before they are needed."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``exports`` maps a public name to the
    module that defines it (``"name:attr"`` when the module calls it otherwise); a name is
    imported on first access and kept in ``namespace`` (the package's globals)."""

    def getattr_(name: str) -> Any:
        where = exports.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = where.partition(":")
        value = getattr(importlib.import_module(module), attr or name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted([*namespace, *exports])

    return getattr_, dir_
