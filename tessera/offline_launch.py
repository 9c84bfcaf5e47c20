"""Start the engine's processes for the offline API: the same supervisor and process specs as
`tessera serve`, without the HTTP server.

    procs = EngineProcesses(config)        # blocks until every process is Ready
    procs.run_dir                          # where Client / AsyncClient connect
    procs.stop()

The supervisor runs as one child (`python -m tessera.offline_launch CONFIG.json`): it owns
signal handling and the children's process groups, so the caller's process (a notebook, a
benchmark) keeps its own signals, and a crash of the caller still lets the supervisor clean up
(it stops everything when its stdin closes).
"""

from __future__ import annotations

import collections
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time

from tessera.bus.run_paths import RUN_PREFIX
from tessera.child_env import child_env
from tessera.config import READY_TIMEOUT_S, Env, ServerConfig

READY_MARK = "TESSERA_OFFLINE_READY"
_STDERR_TAIL = 30


class EngineStartError(RuntimeError):
    """The engine's processes did not come up; the message quotes the supervisor's log."""


def terminate_group(popen: subprocess.Popen, timeout_s: float, kill_wait_s: float) -> None:
    """SIGTERM a child started with `start_new_session=True`; if it has not exited within
    `timeout_s`, SIGKILL its whole process group and wait up to `kill_wait_s`."""
    if popen.poll() is None:
        try:
            popen.send_signal(signal.SIGTERM)
            popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            popen.wait(kill_wait_s)


def _fresh_run_dir(env: Env) -> str:
    # The launcher creates (and later removes) a run directory that does not exist yet.
    root = env.run_root or tempfile.gettempdir()
    return os.path.join(root, f"{RUN_PREFIX}offline-{os.getpid()}-{secrets.token_hex(4)}")


class EngineProcesses:
    def __init__(self, config: ServerConfig,
                 ready_timeout_s: float = READY_TIMEOUT_S["worker"]) -> None:
        env = Env.read()
        if config.run_dir is None:
            config = config.replace(run_dir=_fresh_run_dir(env))
        self.config = config
        self.run_dir: str = str(config.run_dir)
        fd, self._config_file = tempfile.mkstemp(prefix="tessera-offline-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(config.to_json())
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=_STDERR_TAIL)
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "tessera.offline_launch", self._config_file],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True, env=child_env())
        self._ready = threading.Event()
        self._pumps = [threading.Thread(target=self._read_stdout, daemon=True),
                       threading.Thread(target=self._read_stderr, daemon=True)]
        for pump in self._pumps:
            pump.start()
        try:
            self._wait_ready(ready_timeout_s)
        except BaseException:
            # Interrupted while starting (Ctrl-C, a caller's alarm): nothing may stay running.
            if self.alive:
                self.stop()
            raise

    # -- output pumps -----------------------------------------------------------------------
    def _read_stdout(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            if line.startswith(READY_MARK):
                self._ready.set()
            elif line.strip():
                print(line, file=sys.stderr)

    def _read_stderr(self) -> None:
        assert self.popen.stderr is not None
        for raw in self.popen.stderr:
            line = raw.decode(errors="replace")
            self._stderr_tail.append(line.rstrip("\n"))
            # Warnings and errors stay visible; info lines only in the tail kept for errors.
            if self.config.log_level == "debug" or any(
                    k in line for k in (" WARNING ", " ERROR ", " CRITICAL ", "Traceback")):
                sys.stderr.write(line)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._ready.wait(0.1):
            code = self.popen.poll()
            if code is not None:
                time.sleep(0.2)  # let the pump read the last lines
                self._cleanup_file()
                raise EngineStartError(
                    f"the engine stopped during start-up (exit code {code}):\n" + self.log_tail())
            if time.monotonic() > deadline:
                self.stop()
                raise EngineStartError(f"the engine was not ready within {timeout_s:g} s:\n"
                                       + self.log_tail())

    def log_tail(self) -> str:
        return "\n".join(self._stderr_tail)

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM the supervisor (it stops its children in order), SIGKILL the group if it
        does not finish in time. Returns its exit code."""
        terminate_group(self.popen, timeout_s, 5)
        if self.popen.stdin is not None:
            try:
                self.popen.stdin.close()
            except OSError:
                pass
        # The pumps end at the pipes' EOF, now that the supervisor has exited. A pipe is closed
        # only once its pump is done: closing it under a reading thread blocks on the
        # reader's lock (a fatal error when the interpreter is exiting).
        for pump, pipe in zip(self._pumps, (self.popen.stdout, self.popen.stderr), strict=True):
            pump.join(5)
            if pipe is not None and not pump.is_alive():
                try:
                    pipe.close()
                except OSError:
                    pass
        self._cleanup_file()
        return self.popen.returncode

    def _cleanup_file(self) -> None:
        try:
            os.unlink(self._config_file)
        except FileNotFoundError:
            pass


# --------------------------------------------------------------------------------------------
# The child: a supervisor of every engine process but the HTTP server
# --------------------------------------------------------------------------------------------


def _watch_parent() -> None:
    """Stop the engine when the parent goes away (its end of our stdin closes)."""
    # The raw descriptor, not sys.stdin: a daemon thread blocked inside the buffered reader
    # holds its lock, and the interpreter's exit then aborts trying to take it.
    try:
        while os.read(0, 65536):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    from tessera.bus.launcher import build_specs, check_config, check_split, run_supervised
    from tessera.bus.process import setup_logging

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m tessera.offline_launch CONFIG.json", file=sys.stderr)
        return 2
    with open(args[0]) as f:
        config = ServerConfig.from_json(f.read())
    setup_logging(config.log_level, "supervisor", config.log_format)
    problem = check_config(config) or check_split(config)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    threading.Thread(target=_watch_parent, daemon=True).start()

    def engine_only(cfg: ServerConfig, paths: object) -> list:
        return [s for s in build_specs(cfg, paths) if s.name != "server"]  # type: ignore[arg-type]

    def on_ready(children: object) -> None:
        print(f"{READY_MARK} {config.run_dir}", flush=True)

    return run_supervised(config, Env.read(), build=engine_only, on_ready=on_ready,
                          kind="offline", argv=[])


if __name__ == "__main__":
    sys.exit(main())
