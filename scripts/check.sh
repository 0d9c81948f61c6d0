#!/usr/bin/env bash
# The fast checks CI runs before the suite (seconds to a minute): lint, format, the layer
# contracts and the type check. Run it before you commit:  bash scripts/check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
echo "ruff check";          $BIN/ruff check .
echo "ruff format --check"; $BIN/ruff format --check .
echo "lint-imports";        $BIN/lint-imports --no-cache
echo "mypy";                $BIN/mypy
