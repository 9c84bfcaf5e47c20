from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.hal.doctor import main
from tests.hal.fake_plugins import BROKEN, install_fake_plugin


@pytest.fixture(autouse=True)
def _no_env_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TESSERA_HAL", raising=False)


def test_cpu_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--hal", "cpu"]) == 0
    out = capsys.readouterr().out
    rows = re.sub(r" +", " ", out)  # whatever the width of the first column
    for row in ("plugin cpu", "selected plugin ok cpu (by --hal)", "torch",
                "memory", "op attention_extend", "smoke rms_norm", "communicator",
                "backend gloo ok"):
        assert row in rows
    assert "FAIL" not in out
    line = next(li for li in out.splitlines() if li.startswith("op rotary_store_kv"))
    assert line.endswith("fused, native")  # the reference plugin registers every fused op


def test_named_broken_plugin_fails_with_its_traceback_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    install_fake_plugin(tmp_path, "broken", BROKEN)
    assert main([]) == 0  # not selected: a warning row, not a failure
    out = capsys.readouterr().out
    line = next(li for li in out.splitlines() if li.startswith("plugin broken"))
    assert "warn" in line and "RuntimeError: boom: the fake driver is missing" in line
    assert main(["--hal", "broken"]) == 1
    out = capsys.readouterr().out
    line = next(li for li in out.splitlines() if li.startswith("selected plugin"))
    assert "FAIL" in line and "RuntimeError: boom: the fake driver is missing" in line


def test_cli_unknown_plugin_exits_non_zero_listing_installed() -> None:
    env = {**os.environ, "TESSERA_HAL": "nosuch"}
    proc = subprocess.run([sys.executable, "-m", "tessera.cli", "doctor"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    line = next(li for li in proc.stdout.splitlines() if li.startswith("selected plugin"))
    assert "'nosuch' (from TESSERA_HAL) is not installed" in line
    assert "cpu (built-in)" in line and "cuda (built-in)" in line


def test_tessera_doctor_lists_the_model_types(capsys: pytest.CaptureFixture[str]) -> None:
    from tessera.doctor import main as tessera_doctor

    assert tessera_doctor(["--hal", "cpu"]) == 0
    out = capsys.readouterr().out
    line = next(li for li in out.splitlines() if li.startswith("model types"))
    for model_type in ("llama", "mixtral", "qwen3_moe", "dots1", "gemma2", "phi3", "granite"):
        assert model_type in line
    assert "HF cache" in out and "FAIL" not in out
