"""A real server process (`python -m tessera.server`) in front of a FakeEngine, plus strict
HTTP / SSE helpers for the server tests."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any
from urllib.parse import urlparse

from tessera.bus.messages import Ready
from tessera.bus.run_paths import RunPaths
from tessera.client.testing import FakeEngine
from tessera.config import ServerConfig

BASE_CONFIG = dict(host="127.0.0.1", port=0, heartbeat_interval_s=0.1,
                   heartbeat_timeout_s=1.0, request_timeout_s=10.0, drain_timeout_s=5.0)


class ServerUnderTest:
    def __init__(self, token_delay_s: float = 0.002, api_key: str | None = None,
                 context_len: int = 32768, **config: Any) -> None:
        """`api_key` reaches the server as TESSERA_API_KEY, never through its config;
        `context_len` is the fake engine's."""
        self.root = tempfile.mkdtemp(prefix="tss-")
        self.paths = RunPaths.create(os.path.join(self.root, "run"))
        self.config = ServerConfig(**{**BASE_CONFIG, **config})
        with open(self.paths.config_file, "w") as f:
            f.write(self.config.to_json())
        self.engine = FakeEngine(self.paths, token_delay_s=token_delay_s,
                                 context_len=context_len)
        self.log_path = os.path.join(self.root, "server.log")
        self._log = open(self.log_path, "wb")
        env = {k: v for k, v in os.environ.items() if k != "TESSERA_API_KEY"}
        if api_key is not None:
            env["TESSERA_API_KEY"] = api_key
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tessera.server", "--run-dir", self.paths.run_dir],
            stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self.url = self._wait_ready(30.0)
        parsed = urlparse(self.url)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80

    def _wait_ready(self, timeout: float) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            ready = [m for m in self.engine.control if isinstance(m, Ready)]
            if ready:
                return str(ready[0].info["url"])
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"server did not become ready:\n{self.log()}")

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def connection(self, timeout: float = 10.0) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        conn = self.connection()
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None
                                            else None)
        conn.request(method, path, body=data,
                     headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        out = resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        conn.close()
        return out

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.engine.close()
        self._log.close()
        shutil.rmtree(self.root, ignore_errors=True)


_EVENT = re.compile(rb"data: ([^\n]*)\n\n")


def parse_sse(body: bytes) -> list[Any]:
    """Every event of an SSE body, strictly: only `data: ...\\n\\n` events, JSON payloads,
    `[DONE]` (as the string "[DONE]") allowed only last."""
    events: list[Any] = []
    pos = 0
    while pos < len(body):
        match = _EVENT.match(body, pos)
        assert match, f"malformed SSE at byte {pos}: {body[pos:pos + 80]!r}"
        payload = match.group(1)
        assert not events or events[-1] != "[DONE]", "an event after [DONE]"
        events.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
        pos = match.end()
    return events


def check_error_body(body: bytes, status: int) -> dict[str, Any]:
    """OpenAI's error JSON: {"error": {"message", "type", "param", "code"}}."""
    data = json.loads(body)
    assert set(data) == {"error"}, data
    err = data["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and len(err["message"]) > 10
    assert isinstance(err["type"], str) and err["type"]
    return err
