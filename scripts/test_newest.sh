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
# torch stays at the version .venv has: hard-link .venv's installed files instead of a second
# copy (~750 MB; CI holds three venvs); setup then finds torch installed and keeps it
if [ -x .venv/bin/python ] && [ ! -x .venv-newest/bin/python ]; then
    "${PYTHON:-python3}" -m venv .venv-newest
    .venv/bin/python - .venv-newest <<'PY'
import importlib.metadata as m, os, pathlib, shutil, sys
dist = m.distribution("torch")
site = pathlib.Path(dist.locate_file("")).resolve()
target = pathlib.Path(sys.argv[1]) / site.relative_to(pathlib.Path(sys.prefix).resolve())
for entry in dist.files or []:
    src = site / entry
    if entry.parts[0] == ".." or not src.is_file():
        continue  # console scripts: they name .venv's interpreter
    dst = target / entry
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:  # another file system
        shutil.copy2(src, dst)
PY
fi
VENV=.venv-newest GRAFT_UNLOCKED=1 bash scripts/setup.sh
echo "newest allowed: $(.venv-newest/bin/python -c 'import transformers, nnsight, torch; print("transformers", transformers.__version__, "nnsight", nnsight.__version__, "torch", torch.__version__)')"
if [ $# -eq 0 ]; then set -- tests/core tests/cli --ignore=tests/cli/test_integrity_harness.py; fi
exec .venv-newest/bin/python -m pytest -q -p no:cacheprovider "$@"
