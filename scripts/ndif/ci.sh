#!/usr/bin/env bash
# Build the NDIF server's Python 3.12 venv (.venv-ndif) and run graft's tests against the real
# server (tests/remote/real: the harness starts Redis, Ray and the ndif API in a loopback-only
# network namespace, deploys tiny models, runs the tests, tears everything down).
#
#   bash scripts/ndif/ci.sh              # build what is missing, then run the tests
#   bash scripts/ndif/ci.sh --venv-only  # only build the server venv
#
# Needs root (network namespaces), Python >= 3.12 (PYTHON312, else python3.12 on PATH, else
# pyenv's newest 3.12) and the client venv (.venv from scripts/setup.sh, or CLIENT_PYTHON).
# The registry's torch for Python 3.12 is its CUDA build (~4.7 GB, ~3 min to install); it runs
# on the CPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${NDIF_VENV:-.venv-ndif}"

find_python312() {
    if [ -n "${PYTHON312:-}" ]; then echo "$PYTHON312"; return; fi
    if command -v python3.12 >/dev/null && python3.12 -c 'import sys' 2>/dev/null; then
        command -v python3.12; return
    fi
    if command -v pyenv >/dev/null; then
        local v
        v=$(ls -d "$(pyenv root)"/versions/3.12* 2>/dev/null | sort -V | tail -n 1)
        if [ -n "$v" ]; then echo "$v/bin/python"; return; fi
    fi
    echo "no Python 3.12 found: set PYTHON312=/path/to/python3.12" >&2
    exit 2
}

if [ ! -x "$VENV/bin/python" ]; then
    "$(find_python312)" -m venv "$VENV"
fi
VENV="$(cd "$VENV" && pwd)"
PIP="$VENV/bin/python -m pip"
# the versions this harness was written and tested against (torch pinned to the client's)
PINS=("torch==2.13.0" "ndif==0.1.2" "nnsight==0.8.1" "transformers==5.23.0")
if ! "$VENV/bin/python" - "${PINS[@]}" <<'PY'
import importlib.metadata as m, sys
def has(name, version):
    try:
        return m.version(name) == version
    except m.PackageNotFoundError:
        return False
sys.exit(not all(has(*p.split("==")) for p in sys.argv[1:]))
PY
then
    $PIP install -q --upgrade pip setuptools
    $PIP install -q "torch==2.13.0" "ndif[api,ray]==0.1.2" "nnsight==0.8.1" "transformers==5.23.0"
fi
# the server imports graft.remote.hosted (graft pairs) from this checkout; the rest of graft's
# requirements stay client-side
if ! out=$($PIP install -q --no-deps --no-build-isolation -e . 2>&1); then
    echo "$out" >&2
    exit 1
fi

if ! command -v redis-server >/dev/null; then
    apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
fi
echo "server venv: $($VENV/bin/python -c 'import importlib.metadata as m; print(", ".join(p + " " + m.version(p) for p in ("ndif", "nnsight", "torch", "transformers", "ray")))')"
[ "${1:-}" = "--venv-only" ] && exit 0

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
GRAFT_NDIF_SERVER_TESTS=1 NDIF_VENV="$VENV" "${CLIENT_PYTHON:-.venv/bin/python}" -m pytest -q tests/remote/real
