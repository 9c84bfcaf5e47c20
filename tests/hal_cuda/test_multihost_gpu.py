"""Two "hosts" on one two-GPU machine: `tessera serve --nnodes 2` twice (node 1 on the second
GPU through --base-device-id), NCCL meeting over tcp at --dist-init-addr, the bus link
CURVE-encrypted over loopback: greedy tokens equal a one-host TP=2 run's. fp32, the
Llama-3-8B shape cut to 4 layers, random weights."""

from __future__ import annotations

import os

import pytest
import torch

from tessera.bus.replicas import free_port
from tests.bus.test_multihost import free_pair, generate, start_node

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu, pytest.mark.slow,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")]

CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "configs",
                      "llama3-8b-4layer.json")
ENGINE = ["--load-format", "dummy", "--hal", "cuda", "--dtype", "float32", "--tp-size", "2",
          "--max-total-tokens", "32768", "--heartbeat-timeout-s", "60"]
READY_S = 600.0


def prompts() -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(0)
    shared = rng.integers(10, 120_000, size=200).tolist()
    return [rng.integers(10, 120_000, size=n).tolist() for n in (1, 33, 300)] + \
        [shared + [11, 12, 13], shared + [21, 22]]


def test_two_nodes_on_two_gpus_equal_one_host_tp2(tmp_path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from tessera.benchmarks.dummy_model import dummy_model_dir

    model = dummy_model_dir(os.path.abspath(CONFIG))
    port = free_port()
    one = start_node(["--model", model, *ENGINE, "--port", str(port)], tmp_path, "one")
    try:
        one.wait_for("tessera is ready", READY_S)
        want = [generate(f"http://127.0.0.1:{port}", p) for p in prompts()]
    finally:
        one.stop()
    common = ["--model", model, *ENGINE, "--nnodes", "2",
              "--dist-init-addr", f"127.0.0.1:{free_pair()}",
              "--dist-key-file", str(tmp_path / "bus-key.json")]
    node0 = start_node([*common, "--node-rank", "0", "--port", str(port)], tmp_path, "node0")
    node1 = None
    try:
        node0.wait_for("waiting for nodes", READY_S)
        node1 = start_node([*common, "--node-rank", "1", "--base-device-id", "1"], tmp_path,
                           "node1")
        node0.wait_for("tessera is ready", READY_S)
        with ThreadPoolExecutor(len(prompts())) as pool:
            got = list(pool.map(lambda p: generate(f"http://127.0.0.1:{port}", p), prompts()))
    finally:
        for node in (node1, node0):
            if node is not None:
                node.stop()
    assert got == want
