#!/usr/bin/env bash
# The engine and command tests once more with the newest releases that pyproject's ranges
# allow (torch kept at the locked version), in their own venv .venv-newest: an upstream rename
# (transformers 5.24's `cache` argument, say) shows up here before a user meets it.
#
# First a dry run of pip in the locked .venv asks which packages the newest releases would
# change (scripts/newest_differs.py). When none of graft's run-time packages would (only dev
# tools, or nothing), the tests would run a second time on the very packages the suite just
# ran on: the stage says which packages differ and stops there. Otherwise it builds
# .venv-newest and runs the tests on GRAFT_TEST_WORKERS (default 2) pytest-xdist workers.
#
#   bash scripts/test_newest.sh [pytest args]   # default: tests/core tests/cli
#   GRAFT_NEWEST=always bash scripts/test_newest.sh   # run the tests whatever differs
#
# The crash and corruption harnesses (tests/cli/test_integrity_harness.py) test graft's own
# files, not upstream names, and take minutes: they run once, in the main suite.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${GRAFT_NEWEST:-}" != always ]; then
    report=$(mktemp)
    keep=$(mktemp)
    trap 'rm -f "$report" "$keep"' EXIT
    .venv/bin/python -c 'import torch; print("torch==" + torch.__version__)' > "$keep"
    # pip warns about find-links folders that are not there on some machines: not ours to show
    .venv/bin/python -m pip install -q --dry-run --upgrade --upgrade-strategy eager -c "$keep" \
        --report "$report" -e ".[dev]" 2> >(grep -v "is ignored: it is neither" >&2)
    differs=$(.venv/bin/python scripts/newest_differs.py "$report")
    if [ -z "$differs" ]; then
        echo "newest allowed: no run-time package of graft differs from the lock (above: any dev tool that does); the suite just ran on these versions, so no second run"
        exit 0
    fi
    echo "newest allowed, run-time packages that differ from the lock:"
    echo "$differs" | sed 's/^/  /'
fi
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
exec .venv-newest/bin/python -m pytest -q -p no:cacheprovider -n "${GRAFT_TEST_WORKERS:-2}" --dist loadscope "$@"
