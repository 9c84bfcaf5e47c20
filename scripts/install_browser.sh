#!/usr/bin/env bash
# Debian's chromium, for the status page's browser test (tests/server/test_status_page.py).
# CI runs it before the tests (.ci/run). Best effort: where it cannot be installed (not root,
# no apt-get, no package registry) it says so and the browser test skips.
set -uo pipefail
for b in chromium chromium-browser google-chrome; do
  command -v "$b" >/dev/null 2>&1 && exit 0
done
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "[setup] installing chromium (Debian package) for the browser test" >&2
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
         apt-get install -y -qq --no-install-recommends chromium; } >/dev/null 2>&1; then
    echo "[setup] could not install chromium: the browser test will skip" >&2
  fi
else
  echo "[setup] no chromium and no apt-get as root here: the browser test will skip" >&2
fi
exit 0
