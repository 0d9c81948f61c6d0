#!/usr/bin/env bash
# The engine and command tests once more with the newest releases that pyproject's ranges
# allow (torch kept at the locked version), in their own venv .venv-newest: an upstream rename
# (transformers 5.24's `cache` argument, say) shows up here before a user meets it.
#
#   bash scripts/test_newest.sh [pytest args]   # default: tests/core tests/cli
#
# The crash and corruption harnesses (tests/cli/test_integrity_harness.py) test graft's own
# files, not upstream names, and take minutes: they run once, in the main suite.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-newest GRAFT_UNLOCKED=1 bash scripts/setup.sh
echo "newest allowed: $(.venv-newest/bin/python -c 'import transformers, nnsight, torch; print("transformers", transformers.__version__, "nnsight", nnsight.__version__, "torch", torch.__version__)')"
if [ $# -eq 0 ]; then set -- tests/core tests/cli --ignore=tests/cli/test_integrity_harness.py; fi
exec .venv-newest/bin/python -m pytest -q -p no:cacheprovider "$@"
