"""graft.lazy: every name a package of graft exports on first use is defined where its table
says, so a name moved to another module without its table is caught here, not by a user's
``from graft.core import ...``."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import graft

ROOT = Path(graft.__file__).parent
#: the packages whose ``__init__`` exports through :func:`graft.lazy.lazy_exports`
PACKAGES = sorted(
    ".".join(("graft", *init.parent.relative_to(ROOT).parts))
    for init in ROOT.rglob("__init__.py")
    if "lazy_exports(" in init.read_text()
)


def test_the_packages_that_export_lazily_are_found():
    assert {"graft", "graft.core", "graft.storage", "graft.study"} <= set(PACKAGES)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_lazily_exported_name_resolves(package):
    module = importlib.import_module(package)
    missing = []
    for name in module.__all__:
        try:
            getattr(module, name)
        except (AttributeError, ImportError) as err:
            missing.append(f"{name} ({err})")
    assert not missing, f"{package} exports names its modules do not define: {missing}"


def test_a_name_its_module_lacks_is_caught():
    from graft.lazy import lazy_exports

    getattr_, _, names = lazy_exports("pkg", {"graft.storage.files": ("no_such_name",)}, {})
    assert names == ["no_such_name"]
    with pytest.raises(AttributeError):
        getattr_("no_such_name")
