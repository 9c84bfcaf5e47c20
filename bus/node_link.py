"""`python -m tessera.bus.node_link --run-dir DIR`: the bus link between the nodes of a
multi-host engine (`tessera serve --nnodes N`), one per node, over CURVE-encrypted tcp.

Node 0 runs the scheduler; node k > 0 runs only worker ranks. The engine's processes do not
know: on node 0 the link binds the ipc endpoints of the remote ranks (`worker{r}.sock`), so the
scheduler sends them ForwardBatches as to any worker, and pushes what the remote ranks answer
(WorkerReady, SampledTokens, GrammarReady) into `scheduler-results.sock`. On node k the link
binds `scheduler-results.sock` for its local workers and pushes what node 0 sends to their
`worker{r}.sock`.

    node 0  ROUTER, CURVE server, binds tcp://*:PORT+1 (--dist-init-addr HOST:PORT)
    node k  DEALER "node{k}", CURVE client, connects tcp://HOST:PORT+1
    frames  [destination, message frames...]: b"w{r}" worker rank r, b"s" scheduler results,
            b"c" the links themselves (NodeJoin, NodeWelcome, NodeHeartbeat, PageRows)

The page table: the scheduler writes `req_to_token` in node 0's shared memory, which node k
cannot map. Before the first ForwardBatch of a step reaches node k, node 0's link sends the
entries of the batch's rows that node k has not seen yet (PageRows: it keeps a shadow of what
it sent and compares the rows, so a decode step sends one entry per request); node k's link
writes them into a table of its own under the same name in its run, which its workers map.

Joining: node k sends NodeJoin (its ranks and a digest of the engine configuration) and fails
its start if no NodeWelcome comes within --dist-timeout-s, naming the address it tried; node 0
fails if a node has not joined by then. Node loss: the links exchange NodeHeartbeat every
--heartbeat-interval-s; a peer silent for --heartbeat-timeout-s (or a send that does not go
within --send-timeout-ms) is lost, and the link exits non-zero, which stops its node (several
hosts run with --restart-policy off: a restarted rank cannot rejoin the others' collectives).
A node stopped on purpose says so (NodeHeartbeat leaving=True) and the others stop cleanly.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from multiprocessing import shared_memory
from typing import Any

import numpy as np
import zmq

from tessera.bus.channel import Outbox, SendTimeout, context
from tessera.bus.codec import DecodeError, decode, encode
from tessera.bus.curve import connect_curve, read_keys, serve_curve
from tessera.bus.messages import (
    ForwardBatch,
    Message,
    NodeHeartbeat,
    NodeJoin,
    NodeWelcome,
    PageRows,
    WorkerReady,
)
from tessera.bus.process import BusProcess, process_main
from tessera.codes import NODE_LINK, coded
from tessera.config import EngineConfig

log = logging.getLogger(__name__)

CONTROL, RESULTS = b"c", b"s"
# Fields that may differ between the nodes of one engine; every other one must be equal.
PER_NODE_FIELDS = frozenset({
    "node_rank", "run_dir", "host", "port", "log_level", "log_format", "log_interval_s",
    "dist_key_file", "api_key_file", "runs_keep", "base_device_id", "intra_op_threads",
    "replica_metrics_port"})


def worker_dest(rank: int) -> bytes:
    return b"w%d" % rank


def link_endpoint(dist_init_addr: str, bind: bool = False) -> str:
    """tcp endpoint of the link: HOST:PORT + 1 (PORT is torch.distributed's)."""
    host, port = split_addr(dist_init_addr)
    return f"tcp://{'*' if bind else host}:{port + 1}"


def split_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65535:
        raise ValueError(f"--dist-init-addr must be HOST:PORT (PORT below 65535), got {addr!r}")
    return host.strip("[]"), int(port)


def config_digest(config: EngineConfig) -> str:
    data = {k: v for k, v in asdict(config).items() if k not in PER_NODE_FIELDS}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


class RowShadow:
    """What node k's copy of the page table holds, as node 0's link sent it."""

    def __init__(self) -> None:
        self.array: np.ndarray | None = None

    def changes(self, table: np.ndarray, batch: ForwardBatch) -> PageRows:
        if self.array is None or self.array.shape != table.shape:
            self.array = np.full(table.shape, -1, dtype=np.int32)
        rows, starts, pieces = [], [], []
        for row, length in zip(batch.rows.tolist(), batch.seq_lens.tolist(), strict=True):
            current = table[row, :length]
            differ = np.flatnonzero(current != self.array[row, :length])
            if differ.size == 0:
                continue
            start = int(differ[0])
            rows.append(row)
            starts.append(start)
            pieces.append(current[start:].copy())
            self.array[row, start:length] = current[start:]
        offsets = np.zeros(len(pieces) + 1, dtype=np.int32)
        np.cumsum([p.size for p in pieces], out=offsets[1:])
        slots = np.concatenate(pieces).astype(np.int32) if pieces else np.zeros(0, np.int32)
        return PageRows(step=batch.step, rows=np.asarray(rows, np.int32),
                        starts=np.asarray(starts, np.int32), offsets=offsets, slots=slots)


def apply_rows(table: np.ndarray, rows: PageRows) -> None:
    for i, (row, start) in enumerate(zip(rows.rows.tolist(), rows.starts.tolist(),
                                         strict=True)):
        piece = rows.slots[rows.offsets[i]:rows.offsets[i + 1]]
        table[row, start:start + piece.size] = piece


@dataclass
class Member:
    """A node k > 0 as node 0's link sees it."""

    node_rank: int
    identity: bytes = b""
    ranks: list[int] = field(default_factory=list)
    last_seen: float = 0.0
    shadow: RowShadow = field(default_factory=RowShadow)
    last_rows_step: int = -1


class NodeLink(BusProcess):
    name = "link"

    def __init__(self, paths: Any, config: EngineConfig) -> None:
        super().__init__(paths, config)
        self.exit_code = 0
        self.peer: zmq.Socket[Any] | None = None
        self.auth: Any = None
        self.poller = zmq.Poller()
        self.pulls: dict[zmq.Socket[Any], int] = {}  # node 0: remote rank endpoints
        self.results_in: zmq.Socket[Any] | None = None  # node k: local workers' answers
        self.results_out: Outbox | None = None  # node 0: into the scheduler
        self.workers: dict[int, Outbox] = {}  # node k: local worker inboxes
        self.members: dict[int, Member] = {}
        self.head_seen = 0.0
        self.table: np.ndarray | None = None
        self._table_shm: shared_memory.SharedMemory | None = None
        self._attached: shared_memory.SharedMemory | None = None
        self._last_sent_beat = 0.0
        self.started = time.monotonic()
        self.relayed = 0
        self.rows_sent = 0
        self.peer_left = False  # a peer said it stops on purpose: this node stops too

    @property
    def head(self) -> bool:
        return self.config.node_rank == 0

    # --- set-up --------------------------------------------------------------------------

    def setup(self) -> None:
        cfg = self.config
        assert cfg.dist_init_addr and cfg.dist_key_file
        keys = read_keys(cfg.dist_key_file)
        ctx = context()
        self.endpoint = link_endpoint(cfg.dist_init_addr)
        if self.head:
            self.peer = ctx.socket(zmq.ROUTER)
            self.peer.setsockopt(zmq.ROUTER_MANDATORY, 1)
            self.auth = serve_curve(self.peer, keys, ctx)
            self._options(self.peer)
            self.peer.bind(link_endpoint(cfg.dist_init_addr, bind=True))
            local = set(cfg.local_ranks)
            for rank in range(cfg.world_size):
                if rank not in local:
                    sock = ctx.socket(zmq.PULL)
                    sock.setsockopt(zmq.LINGER, 0)
                    sock.bind(self.paths.worker(rank))
                    self.pulls[sock] = rank
                    self.poller.register(sock, zmq.POLLIN)
            self.results_out = Outbox(self.paths.scheduler_results,
                                      timeout_ms=cfg.send_timeout_ms)
            self.members = {k: Member(k) for k in range(1, cfg.nnodes)}
            log.info("link: waiting for nodes %s at %s", sorted(self.members),
                     link_endpoint(cfg.dist_init_addr, bind=True))
        else:
            self.peer = ctx.socket(zmq.DEALER)
            self.peer.setsockopt(zmq.IDENTITY, b"node%d" % cfg.node_rank)
            connect_curve(self.peer, keys)
            self._options(self.peer)
            self.peer.connect(self.endpoint)
            self._join()
            self.results_in = ctx.socket(zmq.PULL)
            self.results_in.setsockopt(zmq.LINGER, 0)
            self.results_in.bind(self.paths.scheduler_results)
            self.poller.register(self.results_in, zmq.POLLIN)
            self.workers = {r: Outbox(self.paths.worker(r), timeout_ms=cfg.send_timeout_ms)
                            for r in cfg.local_ranks}
            self.head_seen = time.monotonic()
        self.poller.register(self.peer, zmq.POLLIN)

    def _options(self, sock: zmq.Socket[Any]) -> None:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, self.config.send_timeout_ms)

    def _join(self) -> None:
        """Node k: NodeJoin, then wait for node 0's NodeWelcome (bounded)."""
        cfg = self.config
        assert self.peer is not None
        join = NodeJoin(node_rank=cfg.node_rank, nnodes=cfg.nnodes,
                        ranks=list(cfg.local_ranks), config_digest=config_digest(cfg))
        self.peer.send_multipart([CONTROL, *encode(join)], copy=False)
        deadline = time.monotonic() + cfg.dist_timeout_s
        while time.monotonic() < deadline:
            if self.stopping:
                raise SystemExit(0)
            if not self.peer.poll(200):
                continue
            frames = self.peer.recv_multipart(copy=False)
            msg = self._decode(frames[1:]) if frames[0].bytes == CONTROL else None
            if isinstance(msg, NodeWelcome):
                if not msg.accepted:
                    raise RuntimeError(f"node 0 at {self.endpoint} refused node "
                                       f"{cfg.node_rank}: {msg.reason}" + coded(NODE_LINK))
                log.info("link: node %d joined node 0 at %s", cfg.node_rank, self.endpoint)
                return
        raise RuntimeError(
            f"node {cfg.node_rank} could not join node 0 at {self.endpoint} within "
            f"{cfg.dist_timeout_s:g} s (--dist-timeout-s): is node 0 started with the same "
            f"--dist-init-addr, is the port reachable, and is --dist-key-file a copy of node "
            f"0's key file? (a peer with another key is refused without an answer)"
            + coded(NODE_LINK))

    def ready_info(self) -> dict[str, Any]:
        return {"node_rank": self.config.node_rank, "nnodes": self.config.nnodes,
                "link": self.endpoint}

    # --- the loop --------------------------------------------------------------------------

    def wait_timeout(self) -> float:
        return 0.0  # tick() blocks in the poller instead

    def tick(self) -> None:
        timeout_ms = int(self.loop_timeout_s * 1000)
        for sock, _ in self.poller.poll(timeout_ms):
            # Take everything waiting on the socket, not one message per wake-up.
            while True:
                try:
                    frames = sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                if sock is self.peer:
                    self._from_peer(frames)
                elif sock is self.results_in:
                    self._to_head(RESULTS, frames)
                else:
                    self._to_member(self.pulls[sock], frames)
                if self.stopping:
                    return
        self._beats()

    def _decode(self, frames: list[Any]) -> Message | None:
        try:
            return decode(frames)
        except DecodeError as exc:
            log.warning("link: dropped a malformed message: %s", exc)
            return None

    def _lost(self, why: str) -> None:
        log.error("link: %s%s", why, coded(NODE_LINK))
        self.exit_code = 1
        self.stopping = True

    def _send_peer(self, frames: list[Any]) -> bool:
        assert self.peer is not None
        # Node 0 addresses a node by its identity b"node{k}".
        who = f"node {bytes(frames[0])[4:].decode()}" if self.head else "node 0"
        try:
            self.peer.send_multipart(frames, copy=False)
            return True
        except (zmq.Again, zmq.ZMQError) as exc:  # ZMQError: ROUTER_MANDATORY, not connected
            if self.peer_left:
                # What was in flight when a peer stopped on purpose finds it gone: expected,
                # and this node's supervisor is stopping it the clean way already.
                log.info("link: %s has left; a message for it was dropped", who)
            elif isinstance(exc, zmq.Again):
                self._lost(f"{who} lost: a send on the link did not go within "
                           f"{self.config.send_timeout_ms} ms")
            else:
                self._lost(f"{who} lost: the link cannot reach it ({exc})")
        return False

    # node 0 -------------------------------------------------------------------------------

    def _member_of(self, rank: int) -> Member | None:
        return next((m for m in self.members.values() if rank in m.ranks), None)

    def _to_member(self, rank: int, frames: list[Any]) -> None:
        member = self._member_of(rank)
        if member is None or not member.identity:
            log.warning("link: a message for worker rank %d, whose node has not joined: "
                        "dropped", rank)
            return
        msg = self._decode(frames)
        if isinstance(msg, ForwardBatch) and msg.step != member.last_rows_step:
            table = self._head_table()
            if table is not None:
                rows = member.shadow.changes(table, msg)
                member.last_rows_step = msg.step
                if rows.rows.size:
                    self.rows_sent += int(rows.slots.size)
                    if not self._send_peer([member.identity, CONTROL, *encode(rows)]):
                        return
        if self._send_peer([member.identity, worker_dest(rank), *frames]):
            self.relayed += 1

    def _head_table(self) -> np.ndarray | None:
        """Node 0: the scheduler's page table, mapped read-only on first use."""
        if self.table is None:
            try:
                shm = shared_memory.SharedMemory(name=self.paths.shm_req_to_token)
            except FileNotFoundError:
                log.error("link: the scheduler's page table does not exist")
                return None
            _untrack(shm)
            width = shm.size // 4 // self.config.max_running_requests
            self._attached = shm
            self.table = np.ndarray((self.config.max_running_requests, width), np.int32,
                                    buffer=shm.buf)
        return self.table

    def _from_member(self, identity: bytes, dest: bytes, frames: list[Any]) -> None:
        member = next((m for m in self.members.values() if m.identity == identity), None)
        if dest == CONTROL:
            msg = self._decode(frames)
            if isinstance(msg, NodeJoin):
                self._welcome(identity, msg)
            elif isinstance(msg, NodeHeartbeat) and member is not None:
                member.last_seen = time.monotonic()
                if msg.leaving:
                    log.info("link: node %d is stopping; stopping this node too",
                             member.node_rank)
                    self._stop_node()
            return
        if member is None:
            log.warning("link: a message from a node that has not joined: dropped")
            return
        member.last_seen = time.monotonic()
        if dest == RESULTS:
            assert self.results_out is not None
            try:
                self.results_out.send_frames(frames)
                self.relayed += 1
            except SendTimeout:
                log.error("link: the scheduler did not take a message from node %d in time",
                          member.node_rank)

    def _welcome(self, identity: bytes, join: NodeJoin) -> None:
        cfg = self.config
        member = self.members.get(join.node_rank)
        expected = list(range(join.node_rank * cfg.ranks_per_node,
                              (join.node_rank + 1) * cfg.ranks_per_node))
        reason = ""
        if member is None or join.nnodes != cfg.nnodes:
            reason = (f"node rank {join.node_rank} of {join.nnodes} does not fit --nnodes "
                      f"{cfg.nnodes}")
        elif join.config_digest != config_digest(cfg):
            reason = ("its engine configuration differs from node 0's (model, sizes and "
                      "batching flags must be the same on every node)")
        elif join.ranks != expected:
            reason = f"it runs ranks {join.ranks}, expected {expected}"
        elif member.identity and member.identity != identity:
            reason = f"node {join.node_rank} has already joined"
        welcome = NodeWelcome(node_rank=join.node_rank, accepted=not reason, reason=reason)
        self._send_peer([identity, CONTROL, *encode(welcome)])
        if reason:
            log.error("link: refused node %d: %s", join.node_rank, reason)
            return
        assert member is not None
        member.identity, member.ranks = identity, list(join.ranks)
        member.last_seen = time.monotonic()
        log.info("link: node %d joined (worker ranks %s)", join.node_rank, join.ranks)

    # node k -------------------------------------------------------------------------------

    def _to_head(self, dest: bytes, frames: list[Any]) -> None:
        msg = self._decode(frames) if self.table is None else None
        if isinstance(msg, WorkerReady):
            self._member_table(msg.max_context_len)
        if self._send_peer([dest, *frames]):
            self.relayed += 1

    def _member_table(self, width: int) -> None:
        """Node k: the page table its workers map, filled from PageRows."""
        rows = self.config.max_running_requests
        name = self.paths.shm_req_to_token
        try:
            shm = shared_memory.SharedMemory(name=name, create=True, size=max(rows * width * 4, 4))
        except FileExistsError:
            stale = shared_memory.SharedMemory(name=name)
            stale.close()
            stale.unlink()
            shm = shared_memory.SharedMemory(name=name, create=True, size=max(rows * width * 4, 4))
        self._table_shm = shm
        self.table = np.ndarray((rows, width), np.int32, buffer=shm.buf)

    def _from_head(self, dest: bytes, frames: list[Any]) -> None:
        self.head_seen = time.monotonic()
        if dest == CONTROL:
            msg = self._decode(frames)
            if isinstance(msg, PageRows):
                if self.table is None:
                    log.error("link: page rows before any worker was ready: dropped")
                else:
                    apply_rows(self.table, msg)
            elif isinstance(msg, NodeHeartbeat) and msg.leaving:
                log.info("link: node 0 is stopping; stopping this node too")
                self._stop_node()
            return
        rank = int(dest[1:]) if dest[:1] == b"w" and dest[1:].isdigit() else -1
        box = self.workers.get(rank)
        if box is None:
            log.warning("link: a message for worker rank %d, not on this node: dropped", rank)
            return
        try:
            box.send_frames(frames)
            self.relayed += 1
        except SendTimeout:
            log.error("link: worker %d did not take a message in time", rank)

    # both ---------------------------------------------------------------------------------

    def _from_peer(self, frames: list[Any]) -> None:
        if self.head:
            if len(frames) < 3:
                return
            self._from_member(frames[0].bytes, frames[1].bytes, frames[2:])
        elif len(frames) >= 2:
            self._from_head(frames[0].bytes, frames[1:])

    def _beats(self) -> None:
        if self.peer_left:
            return  # the peers are stopping (or gone): neither beats nor silences count now
        now = time.monotonic()
        cfg = self.config
        if self.head:
            missing = [k for k, m in self.members.items() if not m.identity]
            if missing and now - self.started > cfg.dist_timeout_s:
                self._lost(f"node(s) {missing} did not join at "
                           f"{link_endpoint(cfg.dist_init_addr or '', bind=True)} within "
                           f"{cfg.dist_timeout_s:g} s (--dist-timeout-s)")
                return
            for m in self.members.values():
                if m.identity and now - m.last_seen > cfg.heartbeat_timeout_s:
                    self._lost(f"node {m.node_rank} lost: silent for "
                               f"{now - m.last_seen:.1f} s on the link")
                    return
        elif now - self.head_seen > cfg.heartbeat_timeout_s:
            self._lost(f"node 0 at {self.endpoint} lost: silent for "
                       f"{now - self.head_seen:.1f} s on the link")
            return
        if now - self._last_sent_beat >= cfg.heartbeat_interval_s:
            self._last_sent_beat = now
            self._send_beat(leaving=False)

    def _send_beat(self, leaving: bool) -> None:
        beat = encode(NodeHeartbeat(node_rank=self.config.node_rank, time=time.time(),
                                    leaving=leaving))
        if self.head:
            for m in self.members.values():
                if m.identity:
                    self._send_peer([m.identity, CONTROL, *beat])
        else:
            self._send_peer([CONTROL, *beat])

    def _stop_node(self) -> None:
        """A peer stops on purpose: stop this node the clean way, through its supervisor,
        whose SIGTERM then stops this process like every other. The link does not stop by
        itself first: a child that ends before the supervisor has taken its signal is a
        failure to the supervisor (node 0 then exited 1 after node 1's clean stop)."""
        if self.peer_left:
            return
        self.peer_left = True
        os.kill(os.getppid(), signal.SIGTERM)

    def stats(self) -> dict[str, float]:
        joined = sum(1 for m in self.members.values() if m.identity)
        return {"relayed": float(self.relayed), "page_entries_sent": float(self.rows_sent),
                "nodes_joined": float(joined if self.head else 1)}

    def teardown(self) -> None:
        if not self.supervisor_alive:
            # Orphaned: this node's supervisor died (a crash, kill -9). Not a stop on purpose:
            # the peers find the node lost by its silence.
            self.exit_code = 1
        if self.peer is not None and self.exit_code == 0:
            self._send_beat(leaving=True)  # a stop on purpose: the peers stop too
        for sock in [*self.pulls, self.results_in, self.peer]:
            if sock is not None:
                sock.close(linger=0 if self.exit_code else 200)
        for box in [*self.workers.values(), self.results_out]:
            if box is not None:
                box.close()
        if self.auth is not None:
            self.auth.stop()
        self.table = None
        if self._attached is not None:
            self._attached.close()
        if self._table_shm is not None:
            self._table_shm.close()
            self._table_shm.unlink()

    def run(self) -> int:
        super().run()
        return self.exit_code


def _untrack(shm: shared_memory.SharedMemory) -> None:
    """Python < 3.13 registers an attachment with the resource tracker, which would unlink
    the scheduler's block when this process exits."""
    from multiprocessing import resource_tracker

    try:
        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - best effort
        pass


def main(argv: list[str] | None = None) -> int:
    return process_main(NodeLink, argv)


if __name__ == "__main__":
    import sys

    sys.exit(main())
