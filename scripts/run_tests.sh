#!/usr/bin/env bash
# Set up like start_all.sh, then run the test suite: ./scripts/run_tests.sh [pytest args]
# The tests run in TESSERA_TEST_WORKERS processes (default 2, pytest-xdist; each test module's
# tests in one of them, so a module's engine fixture starts once); 1 runs them in this
# process, as does passing -n yourself or -p no:xdist.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
cd "$TESSERA_ROOT"
workers=${TESSERA_TEST_WORKERS:-2}
[[ $workers =~ ^[0-9]+$ ]] || { echo "TESSERA_TEST_WORKERS=$workers: expected a number" >&2; exit 2; }
parallel=()
if ((workers > 1)); then
  parallel=(-n "$workers" --dist loadscope)
  for arg in "$@"; do
    case $arg in -n|-n[0-9]*|--numprocesses*|no:xdist|-pno:xdist) parallel=() ;; esac
  done
fi
exec "$VENV/bin/python" -m pytest "${parallel[@]}" "$@"
