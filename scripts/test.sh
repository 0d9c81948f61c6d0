#!/usr/bin/env bash
# Everything CI runs (.ci/run calls exactly this), stage by stage, with each stage's wall time
# printed when it ends and a table of all of them at the end (also after a failure):
#
#   setup    scripts/setup.sh: the locked .venv
#   checks   scripts/check.sh: ruff, the import contracts, mypy
#   fast     the fast tier, serially, with tests/test_fast_tier.py's check that it ran every
#            module of graft (the check traces this process: it cannot be split across workers)
#   slow     the slow tier on GRAFT_TEST_WORKERS pytest-xdist workers (default 2: both cores)
#   newest   scripts/test_newest.sh: the engine and command tests with the newest releases
#            pyproject allows, when they differ from the lock
#   ndif     scripts/ndif/ci.sh: the remote tests against a real NDIF server (needs root)
#
# Each pytest stage prints its 20 slowest tests (--durations=20).
#   bash scripts/test.sh                 # every stage
#   GRAFT_TEST_STAGES="fast slow" bash scripts/test.sh   # some of them (names as above)
set -euo pipefail
cd "$(dirname "$0")/.."
STAGES="${GRAFT_TEST_STAGES:-setup checks fast slow newest ndif}"
WORKERS="${GRAFT_TEST_WORKERS:-2}"
PYTEST=(.venv/bin/python -m pytest -q --durations=20)
# the real-SLURM test fails, rather than skips, where scripts/slurm/start.sh cannot start one
export GRAFT_REQUIRE_SLURM="${GRAFT_REQUIRE_SLURM:-1}"

declare -a TIMES=()
current=""
started=0
report() {
    local status=$?
    [ -n "$current" ] && TIMES+=("$current $((SECONDS - started)) failed")
    echo
    echo "stage times ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores):"
    local total=0 line
    for line in "${TIMES[@]}"; do
        # shellcheck disable=SC2086
        set -- $line
        printf '  %-8s %6d s%s\n' "$1" "$2" "${3:+  ($3)}"
        total=$((total + $2))
    done
    printf '  %-8s %6d s\n' total "$total"
    exit "$status"
}
trap report EXIT

run_stage() {
    local name=$1
    shift
    case " $STAGES " in *" $name "*) ;; *) return 0 ;; esac
    echo "== stage $name: $*"
    current=$name
    started=$SECONDS
    "$@"
    TIMES+=("$name $((SECONDS - started))")
    echo "== stage $name: $((SECONDS - started)) s"
    current=""
}

run_stage setup bash scripts/setup.sh
run_stage checks bash scripts/check.sh
run_stage fast "${PYTEST[@]}" -m "not slow or fast_tier_check"
run_stage slow "${PYTEST[@]}" -m "slow and not fast_tier_check" -n "$WORKERS" --dist loadscope
run_stage newest bash scripts/test_newest.sh
run_stage ndif bash scripts/ndif/ci.sh
