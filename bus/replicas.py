"""`tessera serve --dp-size N`: N replicas behind the SGLang Model Gateway.

    replica i   a whole `tessera serve` (its own supervisor, scheduler, workers, server) on
                127.0.0.1 and a port of its own, on devices base + i * tp-size ...
    gateway     `sglang-router` (bus/gateway.py) on --host/--port, cache-aware by default: it
                keeps an approximate radix tree of the text it sent to each replica and sends
                a prompt to the replica holding most of its prefix, the least loaded one when
                load is uneven; it health-checks the replicas and retries a failed request
    /metrics    on --replica-metrics-port (default --port + 1): each replica's load and the
                routed cache hit rate (replica_metrics.py), then the gateway's metrics

Start: every replica at once, then the gateway once all answer /health. Watch: a replica that
exits is started again after a back-off (restarts.py; the gateway takes it out while its health
checks fail and back when they pass, and sends its requests to the others meanwhile); too many
failures in the window, or the gateway exiting, stops everything. SIGTERM / SIGINT: the gateway
first, then the replicas (each drains its requests), exit 0.
"""

from __future__ import annotations

import json
import logging
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tessera.bus.gateway import INSTALL_HINT, gateway_available
from tessera.bus.parent_death import end_with_parent
from tessera.bus.replica_metrics import fetch, read_replica, render
from tessera.bus.restarts import RestartBook, RestartPolicy
from tessera.bus.signal_flag import SignalFlag
from tessera.bus.supervisor import describe_exit
from tessera.codes import REPLICAS, coded
from tessera.config import READY_TIMEOUT_S, ServerConfig

log = logging.getLogger(__name__)

_LOOP_S = 0.2
STOP_TIMEOUT_S = 30.0
GATEWAY_READY_TIMEOUT_S = 60.0
# Often enough that a replica that died is out of the rotation within seconds (the gateway's
# retries cover the requests sent to it meanwhile).
HEALTH_CHECK_INTERVAL_S = 2


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class Replica:
    index: int
    port: int
    argv: list[str]
    popen: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    ready: bool = False
    restarts: int = 0
    restart_at: float | None = None  # when a replica that died starts again
    routed: bool = False  # the gateway has it (given at start or back, not taken out)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


def replica_argv(argv: list[str], config: ServerConfig, index: int, port: int) -> list[str]:
    """The user's `tessera serve` flags, then what makes replica `index` one engine of its own
    (argparse keeps the last value of a flag given twice)."""
    own = ["--dp-size", "1", "--host", "127.0.0.1", "--port", str(port),
           "--base-device-id", str(config.base_device_id + index * config.world_size)]
    if config.run_dir:
        own += ["--run-dir", f"{config.run_dir.rstrip('/')}/replica{index}"]
    return [sys.executable, "-m", "tessera", "serve", *argv, *own]


def gateway_argv(config: ServerConfig, replicas: list[Replica], metrics_port: int) -> list[str]:
    return [sys.executable, "-m", "tessera.bus.gateway", "--host", config.host,
            "--port", str(config.port), "--worker-urls", *[r.url for r in replicas],
            "--policy", config.router_policy,
            "--cache-threshold", str(config.router_cache_threshold),
            "--balance-abs-threshold", str(config.router_balance_abs_threshold),
            "--balance-rel-threshold", str(config.router_balance_rel_threshold),
            "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(metrics_port),
            "--health-check-interval-secs", str(HEALTH_CHECK_INTERVAL_S),
            "--worker-startup-timeout-secs", str(int(GATEWAY_READY_TIMEOUT_S)),
            # Its info level logs every step of every request's workflow.
            "--log-level", "debug" if config.log_level == "debug" else "warn"]


def _spawn(argv: list[str], prefix: str = "") -> subprocess.Popen[bytes]:
    """Own process group (a Ctrl-C reaches only us; we stop them in order), ended by the
    kernel if we die without stopping them. With `prefix`, its output comes through us, each
    line prefixed: N replicas' logs (and their own ready lines) read apart."""
    if not prefix:
        return subprocess.Popen(argv, start_new_session=True, preexec_fn=end_with_parent)
    popen = subprocess.Popen(argv, start_new_session=True, preexec_fn=end_with_parent,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    threading.Thread(target=_relay, args=(popen, prefix.encode()), daemon=True).start()
    return popen


def _relay(popen: subprocess.Popen[bytes], prefix: bytes) -> None:
    assert popen.stdout is not None
    out = sys.stdout.buffer
    for line in iter(popen.stdout.readline, b""):
        try:
            out.write(prefix + line)
            out.flush()
        except (OSError, ValueError):
            pass  # our stdout is gone: keep draining, so that the replica never blocks
    popen.stdout.close()


def _stop(popen: subprocess.Popen[bytes] | None, timeout: float = STOP_TIMEOUT_S) -> None:
    if popen is None or popen.poll() is not None:
        return
    popen.send_signal(signal.SIGTERM)
    try:
        popen.wait(timeout)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()


class ReplicaSupervisor:
    def __init__(self, config: ServerConfig, argv: list[str]) -> None:
        self.config = config
        self.replicas = [Replica(i, free_port(), []) for i in range(config.dp_size)]
        for r in self.replicas:
            r.argv = replica_argv(argv, config, r.index, r.port)
        self.gateway_metrics_port = free_port()
        self.metrics_port = (config.replica_metrics_port if config.replica_metrics_port
                             is not None else config.port + 1)
        self.gateway: subprocess.Popen[bytes] | None = None
        self.book = RestartBook(RestartPolicy(
            max_restarts=config.restart_max, window_s=config.restart_window_s,
            backoff_s=config.restart_backoff_s))
        self.stopping = SignalFlag()  # set by the SIGTERM / SIGINT handler
        self.failure: str | None = None
        self.http: ThreadingHTTPServer | None = None

    # --- start ---------------------------------------------------------------------------

    def _start_replica(self, replica: Replica) -> None:
        replica.popen = _spawn(replica.argv, prefix=f"[replica {replica.index}] ")
        replica.started_at = time.monotonic()
        replica.ready = False
        replica.restart_at = None
        log.info("replica %d: pid %d, %s", replica.index, replica.popen.pid, replica.url)

    def _wait_replicas(self) -> bool:
        deadline = time.monotonic() + READY_TIMEOUT_S["worker"] + READY_TIMEOUT_S["server"]
        while not self.stopping.is_set() and time.monotonic() < deadline:
            for r in self.replicas:
                if not r.alive:
                    code = r.popen.returncode if r.popen is not None else None
                    self.failure = (f"replica {r.index} failed to start ({describe_exit(code)});"
                                    f" its [replica {r.index}] lines above say why"
                                    + coded(REPLICAS))
                    return False
                if not r.ready and fetch(r.url + "/health", timeout=1.0)[0] == 200:
                    r.ready = True
                    log.info("replica %d is ready", r.index)
            if all(r.ready for r in self.replicas):
                return True
            time.sleep(_LOOP_S)
        if not self.stopping.is_set():
            self.failure = "the replicas were not ready in time"
        return False

    def _start_gateway(self) -> bool:
        self.gateway = _spawn(gateway_argv(self.config, self.replicas,
                                           self.gateway_metrics_port))
        url = f"http://{self._local_host()}:{self.config.port}/workers"
        deadline = time.monotonic() + GATEWAY_READY_TIMEOUT_S
        while not self.stopping.is_set() and time.monotonic() < deadline:
            if self.gateway.poll() is not None:
                self.failure = f"the router exited at start ({describe_exit(self.gateway.poll())})"
                return False
            status, body = fetch(url, timeout=1.0)
            if status == 200 and _healthy_workers(body) >= len(self.replicas):
                for r in self.replicas:
                    r.routed = True
                return True
            time.sleep(_LOOP_S)
        if not self.stopping.is_set():
            self.failure = f"the router did not take the replicas within {GATEWAY_READY_TIMEOUT_S:g} s"
        return False

    def _local_host(self) -> str:
        return "127.0.0.1" if self.config.host in ("0.0.0.0", "::", "") else self.config.host

    # --- /metrics ------------------------------------------------------------------------

    def metrics_text(self) -> str:
        loads = [read_replica(r.index, r.url, r.restarts) for r in self.replicas]
        status, gateway = fetch(f"http://127.0.0.1:{self.gateway_metrics_port}/metrics")
        return render(loads, gateway if status == 200 else "")

    def replicas_json(self) -> list[dict[str, Any]]:
        return [{"replica": r.index, "url": r.url, "pid": r.popen.pid if r.popen else None,
                 "alive": r.alive, "routed": r.routed, "restarts": r.restarts}
                for r in self.replicas]

    def _serve_metrics(self) -> None:
        supervisor = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server name
                if self.path == "/metrics":
                    body = supervisor.metrics_text().encode()
                    kind = "text/plain; version=0.0.4; charset=utf-8"
                elif self.path == "/replicas":
                    body = json.dumps(supervisor.replicas_json()).encode()
                    kind = "application/json"
                else:
                    self.send_error(404, "only /metrics and /replicas here")
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                log.debug("metrics: " + format, *args)

        self.http = ThreadingHTTPServer((self.config.host, self.metrics_port), Handler)
        self.http.daemon_threads = True
        threading.Thread(target=self.http.serve_forever, name="replica-metrics",
                         daemon=True).start()

    # --- watch ---------------------------------------------------------------------------

    def _watch(self) -> None:
        while not self.stopping.is_set():
            now = time.monotonic()
            if self.gateway is not None and self.gateway.poll() is not None:
                self.failure = f"the router exited ({describe_exit(self.gateway.poll())})"
                return
            for r in self.replicas:
                if r.restart_at is not None:
                    if now >= r.restart_at:
                        r.restarts += 1
                        self._start_replica(r)
                    continue
                if r.alive and not r.ready and fetch(r.url + "/health", timeout=0.5)[0] == 200:
                    r.ready = True
                    self._gateway_add(r)
                if not r.alive:
                    code = r.popen.returncode if r.popen is not None else None
                    delay = self.book.record(f"replica{r.index}", now)
                    if delay is None:
                        self.failure = (f"replica {r.index} failed more than "
                                        f"{self.config.restart_max} times in "
                                        f"{self.config.restart_window_s:g} s "
                                        f"(last: {describe_exit(code)})" + coded(REPLICAS))
                        return
                    log.error("replica %d exited (%s); the router sends its requests to the "
                              "others; starting it again in %.1f s", r.index,
                              describe_exit(code), delay)
                    self._gateway_remove(r)
                    r.ready = False
                    r.restart_at = now + delay
            self.stopping.wait(_LOOP_S)

    # The gateway would notice a dead replica by its health checks (seconds) and meanwhile
    # retry requests on it; it is told at once instead, and given the replica back when the
    # new one answers /health.

    def _gateway_url(self, path: str) -> str:
        return f"http://{self._local_host()}:{self.config.port}{path}"

    def _gateway_remove(self, replica: Replica) -> None:
        status, body = fetch(self._gateway_url("/workers"))
        try:
            workers = json.loads(body).get("workers", []) if status == 200 else []
        except (ValueError, AttributeError):
            workers = []
        for worker in workers:
            if isinstance(worker, dict) and worker.get("url") == replica.url:
                code = _send(self._gateway_url(f"/workers/{worker['id']}"), "DELETE")
                log.info("replica %d taken out of the router (%s)", replica.index, code)
        replica.routed = False

    def _gateway_add(self, replica: Replica) -> None:
        code = _send(self._gateway_url("/workers"), "POST", {"url": replica.url})
        replica.routed = code in (200, 201, 202)
        log.info("replica %d is back, given to the router (%s)", replica.index, code)

    def stop(self) -> None:
        _stop(self.gateway)
        threads = [threading.Thread(target=_stop, args=(r.popen,)) for r in self.replicas]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self.http is not None:
            self.http.shutdown()
            self.http.server_close()

    def run(self) -> int:
        def on_signal(signum: int, _frame: Any) -> None:
            log.info("%s: stopping the router, then the replicas",
                     signal.Signals(signum).name)
            self.stopping.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        try:
            self._serve_metrics()
            for r in self.replicas:
                self._start_replica(r)
            if self._wait_replicas() and self._start_gateway():
                print(self.banner(), flush=True)
                self._watch()
        finally:
            self.stop()
        if self.failure:
            log.error("%s", self.failure)
            return 1
        return 0

    def banner(self) -> str:
        host = self._local_host()
        return (f"\ntessera is ready at http://{host}:{self.config.port}  ({len(self.replicas)} "
                f"replicas behind the router, policy {self.config.router_policy}; stop with "
                f"Ctrl-C)\n  replicas: {', '.join(r.url for r in self.replicas)}\n"
                f"  their load and the routed cache hit rate: "
                f"http://{host}:{self.metrics_port}/metrics\n")


def _send(url: str, method: str, body: dict[str, Any] | None = None) -> int:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5.0) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def _healthy_workers(body: str) -> int:
    try:
        workers = json.loads(body).get("workers", [])
    except (ValueError, AttributeError):
        return 0
    return sum(1 for w in workers if isinstance(w, dict) and w.get("is_healthy"))


def check_replicas(config: ServerConfig) -> str | None:
    if config.dp_size < 1:
        return f"--dp-size must be at least 1, got {config.dp_size}"
    if config.dp_size > 1 and config.nnodes > 1:
        return "--dp-size with --nnodes > 1 is not supported: run one multi-host engine"
    if config.dp_size > 1 and not gateway_available():
        return INSTALL_HINT
    return None


def run_replicas(config: ServerConfig, argv: list[str]) -> int:
    return ReplicaSupervisor(config, argv).run()
