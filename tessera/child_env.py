"""The environment for a Python child process that must import what this process imports.

A child started with `sys.executable` sees only what its environment says: packages this
process found through an entry of sys.path that came from elsewhere (a wheel folder added by
a test runner, a checkout put on the path by pytest's rootdir) are missing there unless
PYTHONPATH carries them. `child_env()` is os.environ with PYTHONPATH naming every sys.path
entry of this process (first, in order), so the child never depends on what its caller
remembered to export."""

from __future__ import annotations

import os
import sys


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    seen: set[str] = set()
    entries: list[str] = []
    for entry in [*sys.path, *env.get("PYTHONPATH", "").split(os.pathsep)]:
        if not entry:
            continue  # the current directory: the child's own cwd decides
        path = os.path.abspath(entry)
        if path not in seen and os.path.exists(path):
            seen.add(path)
            entries.append(path)
    env["PYTHONPATH"] = os.pathsep.join(entries)
    env.update(extra or {})
    return env
