"""The ndif API app (``ndif.services.api.app:app``), with anyio imported before nnsight.

nnsight 0.8.1 adds a ``save`` attribute to every object. anyio imports some of its modules
lazily, on first use, and one of them (``anyio.abc._sockets``) defines typed-attribute
classes that then refuse that untyped attribute (``TypeError: Attribute 'save' is missing
its type annotation``). The ndif API imports nnsight at start; starlette spools an upload
over 1 MiB to disk through anyio's thread pool, which is such a first use, so every request
over 1 MiB failed with HTTP 400 "There was an error parsing the body". Importing anyio whole
first avoids it; nothing else changes. The harness (``harness.py``) serves the API from here.
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil

import anyio

for _module in pkgutil.walk_packages(anyio.__path__, "anyio."):
    if "pytest" not in _module.name:
        # an optional backend (trio) may not be installed
        with contextlib.suppress(ImportError):
            importlib.import_module(_module.name)

from ndif.services.api.app import app  # noqa: E402

__all__ = ["app"]
