"""Fixtures shared by every test folder. Keep this small: folder-specific fixtures belong in
that folder's own conftest.py."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Idle OpenMP threads sleep instead of spinning (what the engine's own processes do,
# hal/host_threads.py): under pytest-xdist two test processes share the cores, and one's
# spinning threads held them through the other's time slices (the default model's parity
# fixture, transformers' greedy tokens: 119 s spinning, 34 s passive). Read once, when torch
# loads. Each process keeps torch's threads: while one waits on an engine it started, the
# other's ops may use the idle core.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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


# The modules that take longest (seconds in `run_tests.sh --durations=0` on a 2-core machine
# at 195708c), run first: pytest-xdist hands out whole modules (--dist loadscope) in this
# order, so the short ones fill in at the end instead of one long module running alone there.
SLOW_MODULES = {
    "tests/server/test_apps_e2e.py": 240,
    "tests/offline/test_parallel_engine.py": 200,
    "tests/hal_cuda/test_kernels_compile.py": 185,
    "tests/worker_proc/test_parity_default.py": 160,
    "tests/test_engine_faults.py": 140,
    "tests/offline/test_offline_engine.py": 135,
    "tests/bus/test_replicas.py": 70,
    "tests/benchmarks/test_bench_engine.py": 65,
    "tests/server/test_e2e.py": 65,
    "tests/hal_cuda/test_quant_interpreted.py": 60,
    "tests/hal_cuda/test_kernels_interpreted.py": 60,
    "tests/benchmarks/test_bench_quant.py": 60,
    "tests/offline/test_quantized_default.py": 55,
    "tests/benchmarks/test_b5.py": 50,
    "tests/benchmarks/test_bench_spec.py": 50,
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slowest modules first (SLOW_MODULES), the rest in collection order."""
    def weight(item: pytest.Item) -> int:
        return -SLOW_MODULES.get(item.nodeid.split("::", 1)[0], 0)

    items.sort(key=weight)  # stable: each module's tests keep their order
