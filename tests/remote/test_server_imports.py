"""What the NDIF server's venv imports of graft (scripts/ndif: the deploy script and the
hosted pairs) needs none of graft's client-side requirements: that venv installs graft
without its dependencies, so a new import of polars there fails only in the NDIF stage."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Modules scripts/ndif imports, directly or inside the server.
SERVER_SIDE = [
    "graft.models.tiny",
    "graft.models.loading",
    "graft.remote.config",
    "graft.remote.hosted",
]
#: graft's requirements that the server's venv does not install.
CLIENT_ONLY = ["polars", "pyarrow", "click", "matplotlib", "statsmodels", "scipy", "faker"]


@pytest.mark.slow  # a fresh interpreter: what is imported is the point
def test_the_server_side_modules_need_no_client_requirement():
    code = (
        f"import sys\nfor m in {SERVER_SIDE!r}: __import__(m)\n"
        f"print(sorted(m for m in {CLIENT_ONLY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
