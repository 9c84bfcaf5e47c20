"""The fused kernels, every quantized-GEMV formulation and every MoE tile compile for sm_90
here, without a GPU (tests/hal_cuda/compile_for_sm90.py): what the interpreter tests cannot
show."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("compile_for_sm90.py")


def test_fused_kernels_compile_for_sm90(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    proc = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results and all(r == "ok" for r in results.values()), results
