"""Fixtures shared by every test folder. Keep this small: folder-specific fixtures belong in
that folder's own conftest.py."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.hal import host_threads

# Idle OpenMP threads sleep instead of spinning, as in the engine's own processes: under
# pytest-xdist two test processes share the cores, and one's spinning threads held them
# through the other's time slices (the default model's parity fixture, transformers' greedy
# tokens: 119 s spinning, 34 s passive). Before torch loads, which reads it once. Each process
# keeps torch's threads: while one waits on an engine it started, the other's ops may use the
# idle core.
host_threads.set_wait_policy()

import torch  # noqa: E402

# Triton decides at import whether its jit functions (its own library's too) are compiled or
# interpreted, so on a machine without a GPU the interpreter must be chosen before anything in
# the session imports triton: the cuda plugin's kernels then run (in fp32) on the CPU.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Every `tessera serve` a test starts records its manifest under the runs folder: keep the
# suite's in a folder of its own, removed at the end, not in the user's home.
if "TESSERA_RUNS_DIR" not in os.environ:
    import atexit

    _runs = tempfile.mkdtemp(prefix="tessera-test-runs-")
    os.environ["TESSERA_RUNS_DIR"] = _runs
    atexit.register(shutil.rmtree, _runs, ignore_errors=True)


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
