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
# The registry's torch for Python 3.12 is its CUDA build (5.4 GB installed, 6.9 GB at the
# peak of the install, ~2 min); it runs on the CPU.
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

# the versions this harness was written and tested against (torch pinned to the client's)
PINS=("torch==2.13.0" "ndif==0.1.2" "nnsight==0.8.1" "transformers==5.23.0")
has_pins() {
    [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "${PINS[@]}" <<'PY'
import importlib.metadata as m, sys
def has(name, version):
    try:
        return m.version(name) == version
    except m.PackageNotFoundError:
        return False
sys.exit(not all(has(*p.split("==")) for p in sys.argv[1:]))
PY
}
if ! has_pins; then
    # measured: 5.4 GB installed, 6.9 GB at the peak of the install (pip's unpacked downloads)
    need_mb=7500
    mkdir -p "$(dirname "$VENV")"
    for dir in "$(dirname "$VENV")" "${TMPDIR:-/tmp}"; do
        free_mb=$(df -Pm "$dir" | awk 'NR == 2 {print $4}')
        if [ "$free_mb" -lt "$need_mb" ]; then
            echo "scripts/ndif/ci.sh: building the NDIF server venv needs about $((need_mb / 1000)) GB free (torch's CUDA build for Python 3.12), $dir has $((free_mb / 1000)) GB: free disk space there, or set NDIF_VENV and TMPDIR to a disk that has it" >&2
            exit 2
        fi
    done
    [ -x "$VENV/bin/python" ] || "$(find_python312)" -m venv "$VENV"
    # --no-cache-dir: a cached copy of these wheels would take several GB more (not measured)
    "$VENV/bin/python" -m pip install -q --no-cache-dir --upgrade pip setuptools
    "$VENV/bin/python" -m pip install -q --no-cache-dir "${PINS[@]/#ndif==/ndif[api,ray]==}"
fi
VENV="$(cd "$VENV" && pwd)"
PIP="$VENV/bin/python -m pip"
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
