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


def _compile(tmp_path: Path, *args: str) -> dict[str, str]:
    """compile_for_sm90.py run with `args` (no interpreter, its own Triton cache): each case's
    outcome."""
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results: dict[str, str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return results


@pytest.mark.parametrize("shard", ["0/2", "1/2"])
def test_fused_kernels_compile_for_sm90(tmp_path: Path, shard: str) -> None:
    """In two halves (every other case each), so neither nears its timeout on a slow machine
    and two test workers share the compiles."""
    results = _compile(tmp_path, f"--shard={shard}")
    assert results and all(r == "ok" for r in results.values()), results


def test_pdl_kernels_wait_before_touching_memory(tmp_path: Path) -> None:
    """Every kernel launched with programmatic dependent launch (hal/cuda/pdl.py), compiled
    for sm_90 with USE_PDL: griddepcontrol.wait comes before its first global load, store or
    copy (only the GEMVs' L2 prefetches of their weights come earlier, and must), and
    launch_dependents after the wait. A kernel that read its input before the wait would race
    the kernel that writes it."""
    results = _compile(tmp_path, "--pdl")
    assert len(results) >= 18 and all(r == "ok" for r in results.values()), results


def test_pdl_order_check_catches_a_load_before_the_wait() -> None:
    """The PTX check itself: a load ahead of the wait, a release ahead of it, a missing
    prefetch and a missing wait are each reported."""
    sys.path.insert(0, str(SCRIPT.parent))
    from compile_for_sm90 import pdl_order

    good = ("prefetch.global.L2 [%rd5];\n griddepcontrol.wait ;\n"
            " griddepcontrol.launch_dependents ;\n ld.global.v4.b32 {%r1}, [%rd1];")
    assert pdl_order(good, prefetch=True) == "ok"
    assert pdl_order(good.replace("prefetch.global.L2 [%rd5];", "ld.global.b32 %r2, [%rd2];"),
                     prefetch=False).startswith("global memory touched before the wait")
    assert pdl_order(" griddepcontrol.launch_dependents ;\n griddepcontrol.wait ;\n"
                     " st.global.b16 [%rd1], %rs1;") == "launch_dependents before the wait"
    assert pdl_order(good.replace("prefetch.global.L2 [%rd5];", ""), prefetch=True) == \
        "no L2 prefetch of the weights before the wait"
    assert pdl_order("ld.global.b32 %r2, [%rd2];") == "no griddepcontrol.wait / launch_dependents"
