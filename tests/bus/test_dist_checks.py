"""What `tessera serve` refuses before starting anything, for --dp-size and --nnodes, and the
process plan of each node."""

from __future__ import annotations

import pytest

from tessera.bus import replicas
from tessera.bus.launcher import build_specs, check_config, check_nodes
from tessera.bus.run_paths import RunPaths
from tessera.config import ServerConfig


def test_dp_without_the_gateway_says_how_to_install_it(monkeypatch) -> None:
    monkeypatch.setattr(replicas, "gateway_available", lambda: False)
    problem = replicas.check_replicas(ServerConfig(dp_size=2))
    assert problem is not None and "pip install 'tessera[router]'" in problem
    assert replicas.check_replicas(ServerConfig(dp_size=1)) is None


@pytest.mark.parametrize("changes,words", [
    ({"nnodes": 2}, "--dist-init-addr HOST:PORT"),
    ({"nnodes": 2, "dist_init_addr": "host"}, "HOST:PORT"),
    ({"nnodes": 2, "node_rank": 2, "dist_init_addr": "h:1"}, "--node-rank"),
    ({"nnodes": 2, "tp_size": 3, "dist_init_addr": "h:1"}, "must divide"),
])
def test_node_flags_are_checked(changes: dict[str, object], words: str) -> None:
    problem = check_nodes(ServerConfig(**changes))  # type: ignore[arg-type]
    assert problem is not None and words in problem


def test_dp_with_several_nodes_is_refused() -> None:
    config = ServerConfig(dp_size=2, nnodes=2, tp_size=2, dist_init_addr="h:1")
    assert "--dp-size with --nnodes" in (check_config(config) or "")


def test_each_node_runs_its_ranks(tmp_path) -> None:
    paths = RunPaths(str(tmp_path))
    common = {"tp_size": 4, "nnodes": 2, "dist_init_addr": "h:1"}
    head = [s.name for s in build_specs(ServerConfig(**common), paths)]  # type: ignore[arg-type]
    assert head[:3] == ["link", "worker0", "worker1"] and "scheduler" in head
    assert "server" in head
    other = build_specs(ServerConfig(node_rank=1, **common), paths)  # type: ignore[arg-type]
    assert [(s.name, s.stage) for s in other] == [("link", 0), ("worker2", 1), ("worker3", 1)]
