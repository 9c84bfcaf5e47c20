"""Type checking is part of the suite: mypy on the whole installed namespace (`tessera.*`,
the folders at the top of the repository) must be clean. The folders are linked into a
temporary `tessera/` tree, the layout mypy needs to name the modules as they are imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bus", "hal", "formats", "worker_proc", "scheduler_proc", "tokenizer_proc",
            "detokenizer_proc", "client", "server", "benchmarks")


def test_mypy_is_clean(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    tree = tmp_path / "tessera"
    tree.mkdir()
    for source in (ROOT / "tessera").glob("*.py"):
        (tree / source.name).symlink_to(source)
    for package in PACKAGES:
        (tree / package).symlink_to(ROOT / package, target_is_directory=True)
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(ROOT / ".mypy_cache"), "-p", "tessera"],
        cwd=tmp_path, env={"MYPYPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
