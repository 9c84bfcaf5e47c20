#!/usr/bin/env bash
# Set up like start_all.sh, then run the test suite: ./scripts/run_tests.sh [pytest args]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
cd "$TESSERA_ROOT"
exec "$VENV/bin/python" -m pytest "$@"
