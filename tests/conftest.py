"""Fixtures shared by every test folder. Keep this small: folder-specific fixtures belong in
that folder's own conftest.py."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def run_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short private folder for run directories, set as TESSERA_RUN_ROOT.

    Short on purpose: an ipc:// socket path must fit in 107 bytes, which pytest's tmp_path
    (deep under /tmp/pytest-of-USER/...) can exceed.
    """
    root = Path(tempfile.mkdtemp(prefix="tsr-"))
    monkeypatch.setenv("TESSERA_RUN_ROOT", str(root))
    yield root
    shutil.rmtree(root, ignore_errors=True)
