"""Two "hosts" on one machine: two `tessera serve` launchers with --nnodes 2 over loopback tcp
(node 0 runs the engine and worker rank 0, node 1 worker rank 1) serve greedy tokens equal to
a one-host TP=2 run of the same random tiny Llama, prompts sharing a prefix included (the
remote node's page table is fed through the link). Node 1 killed: node 0 sees it lost and
stops, naming it. A node that cannot reach node 0 fails its start, naming the address."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import zmq

from tessera.bus.replicas import free_port
from tessera.child_env import child_env

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")]

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "intermediate_size": 128, "vocab_size": 256, "hidden_act": "silu",
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 512,
        "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2}
ENGINE = ["--load-format", "dummy", "--hal", "cpu", "--dtype", "float32", "--tp-size", "2",
          "--max-total-tokens", "2048", "--max-running-requests", "8",
          "--intra-op-threads", "1", "--heartbeat-timeout-s", "3"]
READY_S = 180.0
MAX_TOKENS = 12


def prompts() -> list[list[int]]:
    rng = np.random.default_rng(5)
    shared = rng.integers(3, 256, 40).tolist()  # longer than a page: a cached prefix
    return [shared + rng.integers(3, 256, n).tolist() for n in (3, 9, 17)] + \
        [rng.integers(3, 256, 30).tolist()]


def free_pair() -> int:
    """A port P with P + 1 free too (torch.distributed at P, the link at P + 1)."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports")


@dataclass
class Node:
    proc: subprocess.Popen[bytes]
    log_path: str

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log():
            assert self.proc.poll() is None, f"exited:\n{self.log()[-5000:]}"
            assert time.monotonic() < deadline, f"no {text!r}:\n{self.log()[-5000:]}"
            time.sleep(0.3)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def start_node(args: list[str], folder: Path, name: str) -> Node:
    log_path = str(folder / f"{name}.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tessera", "serve", *args], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env=child_env())
    return Node(proc, log_path)


def generate(url: str, ids: list[int]) -> list[int]:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": MAX_TOKENS,
                                                  "temperature": 0, "ignore_eos": True}}
    req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return list(json.loads(resp.read())["output_ids"])


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tessera.benchmarks.dummy_model import resolve_dummy_model

    path = tmp_path_factory.mktemp("tiny") / "tiny-llama.json"
    path.write_text(json.dumps(TINY))
    return resolve_dummy_model(str(path), "dummy")


@pytest.fixture(scope="module")
def one_host(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> list[list[int]]:
    folder = tmp_path_factory.mktemp("onehost")
    port = free_port()
    node = start_node(["--model", tiny_model, *ENGINE, "--port", str(port)], folder, "one")
    try:
        node.wait_for("tessera is ready", READY_S)
        return [generate(f"http://127.0.0.1:{port}", p) for p in prompts()]
    finally:
        node.stop()


def start_pair(model: str, folder: Path) -> Iterator[tuple[Node, Node, int]]:
    addr = f"127.0.0.1:{free_pair()}"
    port = free_port()
    common = ["--model", model, *ENGINE, "--nnodes", "2", "--dist-init-addr", addr,
              "--dist-key-file", str(folder / "bus-key.json")]
    node0 = start_node([*common, "--node-rank", "0", "--port", str(port)], folder, "node0")
    node1 = None
    try:
        node0.wait_for("waiting for nodes", READY_S)  # node 0 wrote the key file
        node1 = start_node([*common, "--node-rank", "1"], folder, "node1")
        node0.wait_for("tessera is ready", READY_S)
        node1.wait_for("tessera node 1 of 2 is ready", READY_S)
        yield node0, node1, port
    finally:
        for node in (node1, node0):
            if node is not None:
                node.stop()


@pytest.fixture(scope="module")
def two_hosts(tiny_model: str, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[tuple[Node, Node, int]]:
    yield from start_pair(tiny_model, tmp_path_factory.mktemp("twohosts"))


def test_two_hosts_give_the_tokens_of_one(two_hosts, one_host) -> None:
    _, _, port = two_hosts
    url = f"http://127.0.0.1:{port}"
    with ThreadPoolExecutor(4) as pool:  # batched together, prefix shared
        got = list(pool.map(lambda p: generate(url, p), prompts()))
    assert got == one_host
    assert all(len(g) == MAX_TOKENS for g in got)


def test_losing_node_1_stops_node_0_naming_it(two_hosts) -> None:
    node0, node1, _ = two_hosts
    os.killpg(node1.proc.pid, signal.SIGKILL)  # the host is gone: nothing says goodbye
    node1.proc.wait()
    assert node0.proc.wait(60) != 0
    assert "node 1 lost" in node0.log()


def test_a_node_stopped_on_purpose_stops_the_other_cleanly(tiny_model, tmp_path) -> None:
    pair = start_pair(tiny_model, tmp_path)
    node0, node1, _ = next(pair)
    try:
        node1.proc.send_signal(signal.SIGTERM)  # the operator stops node 1
        assert node1.proc.wait(60) == 0
        assert node0.proc.wait(60) == 0, node0.log()[-3000:]
        assert "node 1 is stopping; stopping this node too" in node0.log()
    finally:
        pair.close()


def test_a_node_that_cannot_join_names_the_address(tmp_path, tiny_model) -> None:
    from tessera.bus.curve import ensure_keys

    key = str(tmp_path / "bus-key.json")
    ensure_keys(key)
    port = free_pair()  # nothing listens there
    node = start_node(["--model", tiny_model, *ENGINE, "--nnodes", "2", "--node-rank", "1",
                       "--dist-init-addr", f"127.0.0.1:{port}", "--dist-key-file", key,
                       "--dist-timeout-s", "3"], tmp_path, "lonely")
    try:
        assert node.proc.wait(120) != 0
    finally:
        node.stop()
    assert f"could not join node 0 at tcp://127.0.0.1:{port + 1} within 3 s" in node.log()
