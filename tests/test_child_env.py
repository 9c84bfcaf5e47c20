"""tessera.child_env: a child started with it imports what its parent could, whatever the
caller exported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.child_env import child_env


@pytest.fixture
def module_on_parent_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module reachable only through a sys.path entry added in this process (as a wheel
    folder a test runner put on the path), with PYTHONPATH not naming it."""
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "only_here_mod.py").write_text("VALUE = 41 + 1\n")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    return "only_here_mod"


def _child_imports(name: str, env: dict[str, str] | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", f"import {name}; print({name}.VALUE)"],
                          env=env, capture_output=True, text=True, timeout=60, cwd="/")


def test_a_child_imports_what_the_parent_found_on_its_path(module_on_parent_path: str) -> None:
    without = _child_imports(module_on_parent_path, dict(os.environ))
    assert without.returncode != 0 and "ModuleNotFoundError" in without.stderr
    got = _child_imports(module_on_parent_path, child_env())
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "42"


def test_the_rest_of_the_environment_is_kept_and_extra_wins(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.setenv("TESSERA_CHILD_ENV_PROBE", "kept")
    monkeypatch.setenv("PYTHONPATH", "/nonexistent-dir-a")
    env = child_env({"TESSERA_CHILD_ENV_PROBE": "extra"})
    assert env["TESSERA_CHILD_ENV_PROBE"] == "extra"
    assert "/nonexistent-dir-a" not in env["PYTHONPATH"].split(os.pathsep)  # gone paths dropped
    assert env["PYTHONPATH"].split(os.pathsep)[0] == os.path.abspath(
        next(p for p in sys.path if p and os.path.exists(p)))
