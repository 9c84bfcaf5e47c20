"""The page-table copy of a remote node: what node 0's link sends for a step (only the entries
node k has not seen) rebuilds, applied on node k, exactly the rows the step reads; and the
engine-configuration digest that both nodes must share."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.bus.messages import ForwardBatch
from tessera.bus.node_link import RowShadow, apply_rows, config_digest, link_endpoint, split_addr
from tessera.config import EngineConfig


def batch(step: int, rows: list[int], seq_lens: list[int]) -> ForwardBatch:
    n = len(rows)
    i32 = np.zeros(n, np.int32)
    f32 = np.zeros(n, np.float32)
    return ForwardBatch(step=step, rows=np.asarray(rows, np.int32),
                        seq_lens=np.asarray(seq_lens, np.int32), extend_lens=i32 + 1,
                        input_ids=i32, sample=np.ones(n, np.uint8), output_lens=i32,
                        temperature=f32, top_p=f32 + 1, top_k=i32, min_p=f32,
                        repetition_penalty=f32 + 1, frequency_penalty=f32,
                        presence_penalty=f32, seeds=np.full(n, -1, np.int64),
                        logprobs=i32 - 1)


def test_rows_rebuild_the_table_and_decode_steps_send_one_entry_per_request() -> None:
    rng = np.random.default_rng(0)
    head = np.zeros((4, 64), np.int32)  # the scheduler's table on node 0
    member = np.zeros((4, 64), np.int32)  # node k's copy
    shadow = RowShadow()
    head[1, :20] = rng.integers(1, 1000, 20)
    head[3, :33] = rng.integers(1, 1000, 33)
    sent = shadow.changes(head, batch(0, [1, 3], [20, 33]))  # two prefills
    apply_rows(member, sent)
    assert sent.slots.size == 53
    for step in range(1, 4):  # decodes: one new slot per request
        head[1, 19 + step] = 2000 + step
        head[3, 32 + step] = 3000 + step
        sent = shadow.changes(head, batch(step, [1, 3], [20 + step, 33 + step]))
        assert sent.slots.size == 2
        apply_rows(member, sent)
    # Row 1 is reused by a new request sharing its first 8 slots (a cached prefix).
    head[1, 8:12] = rng.integers(5000, 6000, 4)
    sent = shadow.changes(head, batch(4, [1, 3], [12, 36]))
    assert sent.rows.tolist() == [1] and sent.starts.tolist() == [8] and sent.slots.size == 4
    apply_rows(member, sent)
    assert np.array_equal(member[1, :12], head[1, :12])
    assert np.array_equal(member[3, :36], head[3, :36])
    assert shadow.changes(head, batch(5, [1, 3], [12, 36])).rows.size == 0


def test_config_digest_ignores_per_node_fields_only() -> None:
    base = EngineConfig(nnodes=2, dist_init_addr="10.0.0.1:5000")
    assert config_digest(base) == config_digest(base.replace(node_rank=1, base_device_id=4,
                                                             log_level="debug"))
    assert config_digest(base) != config_digest(base.replace(max_running_requests=7))


def test_addresses() -> None:
    assert split_addr("10.0.0.1:5000") == ("10.0.0.1", 5000)
    assert link_endpoint("host:5000") == "tcp://host:5001"
    assert link_endpoint("host:5000", bind=True) == "tcp://*:5001"
    with pytest.raises(ValueError, match="HOST:PORT"):
        split_addr("host")


class _GoneSocket:
    """A peer socket whose node is no longer connected (ROUTER_MANDATORY)."""

    def send_multipart(self, frames, copy=True) -> None:
        import zmq

        raise zmq.ZMQError(zmq.EHOSTUNREACH)


def _head_link(monkeypatch: pytest.MonkeyPatch, kills: list[int]):
    from tessera.bus import node_link
    from tessera.bus.run_paths import RunPaths

    link = node_link.NodeLink(RunPaths(run_dir="/nonexistent"),
                              EngineConfig(nnodes=2, node_rank=0))
    link.peer = _GoneSocket()  # type: ignore[assignment]
    link.members[1] = node_link.Member(1, identity=b"node1", ranks=[1], last_seen=0.0)
    # the supervisor (this process's parent) is not signalled here: recorded
    monkeypatch.setattr(node_link.os, "kill", lambda pid, sig: kills.append(sig))
    return link


def test_a_node_that_left_on_purpose_is_not_lost(monkeypatch) -> None:
    """Node 1 says it stops. Node 0's link asks its supervisor to stop the node once, and
    keeps running until the supervisor's SIGTERM: a step it had in flight for node 1 then
    finds node 1 gone, and node 1 falls silent past the heartbeat timeout; neither is a
    lost node. (The two-node test raced twice here: 'node 1 is stopping' then 'node 1
    lost', exit 1; then the link ended by itself before the supervisor took its signal,
    which the supervisor counts as a failure.)"""
    import signal

    kills: list[int] = []
    link = _head_link(monkeypatch, kills)
    link._stop_node()  # what node 1's leaving heartbeat does
    link._stop_node()  # a second leaving heartbeat
    assert kills == [signal.SIGTERM]
    assert link._send_peer([b"node1", b"c", b"x"]) is False
    link._beats()  # node 1 silent since t=0, far past the heartbeat timeout
    assert link.exit_code == 0 and not link.stopping  # the supervisor's SIGTERM stops it


def test_a_node_that_vanishes_unannounced_is_lost(monkeypatch) -> None:
    link = _head_link(monkeypatch, [])
    assert link._send_peer([b"node1", b"c", b"x"]) is False
    assert link.exit_code == 1 and link.stopping
    silent = _head_link(monkeypatch, [])
    silent._beats()  # silent since t=0
    assert silent.exit_code == 1 and silent.stopping
