"""`tessera bench` dispatches to every benchmark and refuses unknown ones."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tessera.benchmarks import cli
from tessera.child_env import child_env

ROOT = Path(__file__).resolve().parents[2]


def test_every_benchmark_resolves() -> None:
    for module, func in cli.BENCHES.values():
        assert callable(getattr(importlib.import_module(module), func))


def test_help_and_unknown(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    assert "serving" in capsys.readouterr().out
    assert cli.main(["nope"]) == 2
    assert "unknown benchmark" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["serving", "offline", "latency", "c1", "peer"])
def test_each_has_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main([name, "--help"])
    assert exit_info.value.code == 0
    assert "usage: tessera bench" in capsys.readouterr().out



def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.integration
@pytest.mark.slow
def test_a_benchmark_ended_by_sigterm_stops_the_server_it_started(tmp_path: Path) -> None:
    """A time limit ends `tessera bench` with SIGTERM: the server it started (a session of its
    own, out of reach of the limit's signal) must stop too, not keep holding the device."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tessera", "bench", "serving", "--workload", "B3",
         "--model", str(ROOT / "benchmarks" / "configs" / "tiny-llama.json"),
         "--load-format", "dummy", "--concurrency", "1", "--requests-per-concurrency", "100",
         "--prompt-len", "8,16", "--output-len", "400,500", "--warmup", "0",
         "--out-dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env(), cwd=str(ROOT))
    server: int | None = None
    try:
        deadline = time.monotonic() + 120
        while server is None:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline
            children = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(proc.pid)],
                                      capture_output=True, text=True).stdout
            server = next((int(line.split()[0]) for line in children.splitlines()
                           if "tessera serve" in line), None)
            time.sleep(0.2)
        time.sleep(3.0)  # starting up or serving: either way it must go
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        assert proc.returncode == 128 + signal.SIGTERM
        stop_by = time.monotonic() + 60
        while _alive(server):
            assert time.monotonic() < stop_by, f"the server {server} outlived its benchmark"
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if server is not None and _alive(server):  # the failure: leave nothing running
            os.killpg(server, signal.SIGTERM)
