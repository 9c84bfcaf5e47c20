"""What `--version` prints and run manifests record: tessera's version, and the commit when it
runs from a git checkout (an editable install)."""

from __future__ import annotations

import functools
import os
import subprocess
from importlib.metadata import PackageNotFoundError, version


def package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


@functools.cache
def source_commit() -> str | None:
    """The checkout's commit (`-dirty` with uncommitted changes to tracked files), or None
    outside a git checkout."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.exists(os.path.join(root, ".git")):
        return None
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root,
                              capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def version_line() -> str:
    from tessera import __version__

    commit = source_commit()
    return f"tessera {__version__}" + (f" (commit {commit})" if commit else "")
