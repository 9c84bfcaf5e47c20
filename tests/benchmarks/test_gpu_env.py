"""scripts/gpu_env: the dry run's stand-in for the GPU machine's Python (benchmarks/run_gpu.sh
with DRY=1) refuses what that machine lacks and lets through what it has."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPU_ENV = ROOT / "scripts" / "gpu_env"
# Engine dependencies the GPU machine may lack: each is imported lazily, by a feature no GPU
# run uses (signed weight manifests).
LAZY_AND_ABSENT = {"cryptography"}


def _run(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TESSERA_GPU_ENV_REFUSED"}
    env["PYTHONPATH"] = os.pathsep.join([str(GPU_ENV), str(ROOT)])
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, cwd=str(ROOT))


def test_what_the_gpu_machine_lacks_is_refused_in_children_too() -> None:
    code = ("import subprocess, sys, msgpack, numpy, zmq\n"
            "try:\n    import jsonschema\nexcept ModuleNotFoundError as e:\n    print('refused', e)\n"
            "r = subprocess.run([sys.executable, '-c', 'import jsonschema'], capture_output=True,"
            " text=True)\nprint('child', r.returncode)\n")
    got = _run(code)
    assert got.returncode == 0, got.stderr
    assert "refused No module named 'jsonschema'" in got.stdout
    assert "child 1" in got.stdout


def _names(text: str) -> set[str]:
    return {w.lower().replace("_", "-") for line in text.splitlines()
            if not line.startswith("#") for w in line.split()}


def test_every_engine_dependency_is_on_the_gpu_machine_or_carried() -> None:
    """A new hard dependency needs a wheel carried to the GPU machine (and its name in
    packages.txt), or the GPU runs fail at import."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[\s\[<>=!~;]", d, maxsplit=1)[0].lower().replace("_", "-")
             for d in deps}
    have = _names((GPU_ENV / "packages.txt").read_text())
    assert names - have == LAZY_AND_ABSENT


def test_the_gpu_scripts_refuse_an_unknown_part_or_call_at_once() -> None:
    """A typo in the device command costs seconds, not a started run."""
    for script, arg in (("run_gpu.sh", "b99"), ("gpu_session.sh", "99")):
        got = subprocess.run(["bash", str(ROOT / "benchmarks" / script), arg],
                             capture_output=True, text=True, timeout=60,
                             env={**os.environ, "DRY": "1"})
        assert got.returncode == 2, (script, got.stderr)
        assert "usage" in got.stderr
