"""Start `tessera serve` for a benchmark and stop it afterwards (B4 runs the same workload on
two servers: with the radix cache and with `--disable-radix-cache`)."""

from __future__ import annotations

import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from tessera.child_env import child_env
from tessera.offline_launch import terminate_group


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """`tessera serve ARGS --port P` as a child; `url` once `wait_ready` returned."""

    def __init__(self, args: list[str] | str, port: int | None = None,
                 log_path: str | None = None, module: str = "tessera") -> None:
        self.args = shlex.split(args) if isinstance(args, str) else list(args)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
        # `module` "tessera" runs `tessera serve`; another module takes the same flags.
        command = ["tessera", "serve"] if module == "tessera" else [module]
        argv = [sys.executable, "-m", *command, *self.args, "--host", "127.0.0.1",
                "--port", str(self.port)]
        print(f"[bench] starting: {shlex.join(argv[1:])}", file=sys.stderr, flush=True)
        self.popen = subprocess.Popen(argv, stdout=self._log, stderr=self._log,
                                      start_new_session=True, env=child_env())

    def wait_ready(self, timeout_s: float = 1800.0) -> str:
        """Poll /health until it answers 200; raise if the server exits or times out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"tessera serve exited with code {self.popen.returncode} "
                                   f"before it was ready (args: {shlex.join(self.args)})")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return self.url
            except (urllib.error.URLError, OSError, TimeoutError):
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"tessera serve was not ready within {timeout_s:g} s")

    def stop(self, timeout_s: float = 60.0) -> None:
        terminate_group(self.popen, timeout_s, 10)
        if self._log is not subprocess.DEVNULL:
            self._log.close()  # type: ignore[union-attr]

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
