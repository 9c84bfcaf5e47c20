#!/usr/bin/env bash
# Set up (first run: .venv, torch, tessera, the default model), then start and supervise every
# tessera process and serve the OpenAI API on http://127.0.0.1:30000.
#   ./scripts/start_all.sh [tessera serve flags: --model PATH --hal cpu --port 30001 ...]
# Ctrl-C or SIGTERM stops everything cleanly: `exec` makes the supervisor this very process.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
exec "$VENV/bin/tessera" serve "$@"
