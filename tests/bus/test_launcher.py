"""`tessera serve` pieces: the process plan, configuration checks, the ready banner."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.bus.launcher import (
    build_specs,
    check_config,
    check_port_free,
    main,
    ready_banner,
    run_supervised,
)
from tessera.bus.run_paths import RunPaths
from tessera.bus.supervisor import Child, ProcessSpec
from tessera.config import Env, ServerConfig


def test_plan_orders_stages_and_names_processes(run_root: Path) -> None:
    paths = RunPaths.create()
    specs = build_specs(ServerConfig(tp_size=2, tokenizer_workers=2), paths)
    assert [(s.name, s.stage) for s in specs] == [
        ("worker0", 0), ("worker1", 0), ("scheduler", 0), ("detokenizer", 0),
        ("tokenizer0", 0), ("tokenizer1", 0), ("server", 1)]
    assert [s.name for s in specs if s.drains] == ["server"]
    worker1 = specs[1]
    assert worker1.argv[1:] == ("-m", "tessera.worker_proc", "--run-dir", paths.run_dir,
                                "--rank", "1")
    # model loading takes longest; the scheduler waits for it
    assert specs[3].ready_timeout_s < worker1.ready_timeout_s < specs[2].ready_timeout_s


def test_config_checks_say_what_is_wrong() -> None:
    assert check_config(ServerConfig()) is None
    assert "--tp-size must be at least 1" in str(check_config(ServerConfig(tp_size=0)))
    assert "--heartbeat-timeout-s" in str(check_config(ServerConfig(heartbeat_timeout_s=0.1)))


def test_busy_port_is_refused_before_anything_starts(run_root: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert "--port" in str(check_port_free("127.0.0.1", port))
        proc = subprocess.run([sys.executable, "-m", "tessera", "serve", "--port", str(port)],
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert list(run_root.iterdir()) == []  # nothing was created
    assert check_port_free("127.0.0.1", port) is None


def test_banner_has_url_model_and_a_curl_line() -> None:
    spec = ProcessSpec("server", ("x",), stage=0)
    child = Child(spec, popen=None, started_at=0.0, info={"model": "SmolLM2"})  # type: ignore[arg-type]
    text = ready_banner(ServerConfig(host="0.0.0.0", port=30001, api_key_file="/k"), [child])
    assert "http://127.0.0.1:30001" in text and "SmolLM2" in text
    assert "curl http://127.0.0.1:30001/v1/chat/completions" in text
    assert "Authorization: Bearer $KEY" in text


def test_too_long_run_dir_is_refused_with_advice(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    config = ServerConfig(run_dir=str(deep))
    assert run_supervised(config, Env(None, None, str(tmp_path), None, None),
                          build=lambda c, p: pytest.fail("must not get this far")) == 2
    assert not deep.exists() or list(deep.iterdir()) == []


@pytest.mark.parametrize("argv", [["--api-key", "K"], ["--api-key=K"]])
def test_a_key_on_the_command_line_is_refused(argv: list[str],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "--api-key-file" in capsys.readouterr().err


def test_an_unreadable_key_file_is_refused_before_start(tmp_path: Path) -> None:
    assert "cannot be read" in check_config(ServerConfig(api_key_file=str(tmp_path / "no")))
