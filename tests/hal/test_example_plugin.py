"""The out-of-tree plugin in tests/hal_plugin_example, pip-installed into a temporary folder
for these tests only: found through its entry point, selected by name, conformant, and shown
by `tessera doctor` with its declared fallbacks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PLUGIN_SRC = Path(__file__).resolve().parents[1] / "hal_plugin_example"


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Environment for subprocesses that see the installed example plugin."""
    root = tmp_path_factory.mktemp("hal_plugin")
    # Build from a copy: pip builds in-tree and would leave build/ and *.egg-info behind.
    src = root / "src"
    shutil.copytree(PLUGIN_SRC, src)
    target = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--no-compile", "--target", str(target), str(src)],
                   check=True, capture_output=True, timeout=120)
    env = os.environ.copy()
    env.pop("TESSERA_HAL", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(target), env.get("PYTHONPATH")) if p)
    yield env
    shutil.rmtree(root, ignore_errors=True)


def _run(env: dict[str, str], *args: str, cwd: Path | None = None, timeout: float = 180
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def test_discovered_and_selected_by_name(plugin_env: dict[str, str]) -> None:
    code = (
        "import json\n"
        "from tessera.hal.registry import discover_plugins, load_platform\n"
        "spec = discover_plugins()['example']\n"
        "p = load_platform('example')\n"
        "print(json.dumps({'origin': spec.origin, 'name': p.name, 'best': load_platform().name,"
        " 'sources': {op: p.op_source(op) for op in ('rms_norm', 'linear')}}))\n"
    )
    proc = _run(plugin_env, "-c", code)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["origin"] == "entry point (tessera-hal-example 0.1.0)"
    assert got["name"] == "example"
    assert got["best"] != "example"  # its low priority keeps it out of the default choice
    assert got["sources"] == {"rms_norm": "native", "linear": "reference"}


def test_passes_conformance(plugin_env: dict[str, str], tmp_path: Path) -> None:
    # Run from an empty folder so that only the suite's own options apply.
    proc = _run(plugin_env, "-m", "pytest", "-p", "tessera.hal.conformance", "--pyargs",
                "tessera.hal.conformance", "--hal-plugin", "example", "-q",
                "-p", "no:cacheprovider", cwd=tmp_path, timeout=900)  # the whole suite
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and " failed" not in proc.stdout


def test_shown_by_doctor(plugin_env: dict[str, str]) -> None:
    proc = _run(plugin_env, "-m", "tessera.cli", "doctor", "--hal", "example")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {line.split()[0] + " " + line.split()[1]: line for line in proc.stdout.splitlines()
            if line.startswith(("plugin ", "op ", "selected "))}
    assert "entry point (tessera-hal-example 0.1.0)" in rows["plugin example"]
    assert "example (by --hal)" in rows["selected plugin"]
    assert "native" in rows["op rms_norm"]
    assert "native" in rows["op attention_decode"]  # capturable, unlike the reference
    assert "reference fallback" in rows["op linear"]
