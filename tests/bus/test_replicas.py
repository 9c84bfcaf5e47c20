"""`tessera serve --dp-size 2` with the default model behind the SGLang Model Gateway: a
prefix-sharing workload is routed so that the replicas' caches find (nearly) as much of it as
one replica alone finds, spread over both replicas; killing one replica leaves the other
serving, and the supervisor starts it again."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from tessera.bus.gateway import gateway_available
from tessera.bus.replica_metrics import ReplicaLoad, read_replica, read_settled
from tessera.bus.replicas import free_port

pytestmark = pytest.mark.skipif(not gateway_available(),
                                reason="the SGLang Model Gateway is not installed "
                                       "(pip install 'tessera[router]')")

START_TIMEOUT_S = 300.0
KEY = "replica-test-key"  # every replica requires it; the gateway passes the client's on
GROUPS, PER_GROUP = 4, 4
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
         "november oscar papa quebec romeo sierra tango uniform victor whiskey xray").split()


@dataclass
class DpEngine:
    proc: subprocess.Popen[bytes]
    url: str
    metrics_url: str
    log_path: str

    def replicas(self) -> list[dict[str, object]]:
        return json.loads(_get(self.metrics_url + "/replicas"))

    def replica_loads(self) -> list[ReplicaLoad]:
        """Read once every request sent so far is counted (the counters come late)."""
        listed = self.replicas()
        return read_settled(lambda: [read_replica(int(r["replica"]), str(r["url"]))
                                     for r in listed])

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()[-6000:]


def _get(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode()


def complete(base: str, prompt: str, key: str | None = KEY) -> dict[str, object]:
    body = json.dumps({"model": "default", "prompt": prompt, "max_tokens": 1,
                       "temperature": 0}).encode()
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(base + "/v1/completions", data=body, headers=headers)
    with urllib.request.urlopen(req, timeout=120) as resp:
        assert resp.status == 200
        return json.loads(resp.read())


def workload(seed: int) -> list[list[str]]:
    """GROUPS groups of PER_GROUP prompts: a long prefix of the group, a short own suffix."""
    rng = random.Random(seed)
    groups = []
    for g in range(GROUPS):
        prefix = " ".join(rng.choice(WORDS) for _ in range(160))
        groups.append([f"{prefix} (seed {seed} group {g} question {q}) answer:"
                       for q in range(PER_GROUP)])
    return groups


def run_groups(base: str, groups: list[list[str]]) -> None:
    """The first prompt of every group at once (each puts its prefix in a cache), then all
    the others at once."""
    with ThreadPoolExecutor(GROUPS * PER_GROUP) as pool:
        list(pool.map(lambda p: complete(base, p), [g[0] for g in groups]))
        list(pool.map(lambda p: complete(base, p), [p for g in groups for p in g[1:]]))


def hit_delta(before: list[ReplicaLoad], after: list[ReplicaLoad]) -> tuple[float, float]:
    hits = sum(a.cache_hit_tokens - b.cache_hit_tokens for a, b in zip(after, before, strict=True))
    queried = sum(a.cache_query_tokens - b.cache_query_tokens for a, b in zip(after, before, strict=True))
    return hits, queried


@pytest.fixture(scope="module")
def dp() -> Iterator[DpEngine]:
    port, metrics_port = free_port(), free_port()
    log_path = tempfile.mktemp(prefix="tessera-dp-", suffix=".log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tessera", "serve", "--dp-size", "2", "--port", str(port),
             "--replica-metrics-port", str(metrics_port), "--max-total-tokens", "8192",
             "--intra-op-threads", "1", "--restart-backoff-s", "0.5", "--log-level",
             "warning"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "TESSERA_API_KEY": KEY})
    engine = DpEngine(proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}",
                      log_path)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while "replicas behind the router" not in engine.log():
            assert proc.poll() is None, f"tessera serve --dp-size 2 exited:\n{engine.log()}"
            assert time.monotonic() < deadline, f"not ready in time:\n{engine.log()}"
            time.sleep(0.5)
        yield engine
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        os.unlink(log_path)


def test_routed_hit_rate_is_near_one_replica_alone(dp: DpEngine) -> None:
    replica0 = str(dp.replicas()[0]["url"])
    before = dp.replica_loads()
    run_groups(replica0, workload(seed=1))  # one replica alone, straight to its server
    alone_hits, alone_queried = hit_delta(before, dp.replica_loads())
    alone = alone_hits / alone_queried

    before = dp.replica_loads()
    run_groups(dp.url, workload(seed=2))  # other prefixes, through the router
    after = dp.replica_loads()
    routed_hits, routed_queried = hit_delta(before, after)
    routed = routed_hits / routed_queried
    assert alone > 0.5, f"the workload shares too little: {alone:.3f} alone"
    assert routed >= 0.9 * alone, f"routed hit rate {routed:.3f}, one replica {alone:.3f}"
    # Both replicas took groups: sending everything to one would also keep the hit rate.
    assert all(a.cache_query_tokens > b.cache_query_tokens for a, b in zip(after, before, strict=True)), \
        [(b.cache_query_tokens, a.cache_query_tokens) for a, b in zip(after, before, strict=True)]
    metrics = _get(dp.metrics_url + "/metrics")
    assert 'tessera:replica_requests_running{replica="1"}' in metrics
    # The gateway's gRPC probes of each replica are refused without a traceback in the log.
    assert "PRI/Upgrade" not in dp.log() and "Traceback" not in dp.log(), dp.log()
    assert "tessera:router_cache_hit_rate " in metrics


@pytest.mark.parametrize("key", [None, "wrong-key"])
def test_the_replicas_keys_hold_through_the_router(dp: DpEngine, key: str | None) -> None:
    with pytest.raises(urllib.error.HTTPError) as info:
        complete(dp.url, "Hello", key=key)
    assert info.value.code == 401
    assert "invalid_api_key" in info.value.read().decode()


def test_killing_a_replica_leaves_the_other_serving(dp: DpEngine) -> None:
    victim = dp.replicas()[1]
    os.killpg(int(victim["pid"]), signal.SIGKILL)  # the replica's supervisor and its engine
    deadline = time.monotonic() + 30.0
    while dp.replicas()[1]["routed"]:  # the supervisor notices and takes it out of the router
        assert time.monotonic() < deadline, dp.log()
        time.sleep(0.1)
    prompts = [p for group in workload(seed=3) for p in group][:8]
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda p: complete(dp.url, p), prompts))
    assert all(r["choices"] for r in replies)  # type: ignore[index]
    deadline = time.monotonic() + 30.0
    while dp.replicas()[1]["restarts"] == 0:  # and starts it again
        assert time.monotonic() < deadline, dp.log()
        time.sleep(0.2)
    assert dp.proc.poll() is None
