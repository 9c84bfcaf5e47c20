"""What one hop of the bus costs on this host: a message from one process to another that
was waiting for it, received one of four ways.

    socket   a PULL socket read by the process's own thread, blocking (the transport alone:
             ZeroMQ's I/O thread on each side)
    spin     the same socket read without blocking, in a loop (no thread is woken to take
             the message: the floor a busy-polling receiver would reach)
    thread   the Inbox (bus/channel.py) without busy polling (--busy-poll-ms 0): its
             receiver thread decodes the message into the double buffer and the loop,
             blocked in drain(), is woken to take it
    poll     the Inbox with busy polling (--busy-poll-ms 20): the loop, waiting in drain(),
             polls the socket itself and takes the message there

The message is a TokenizedRequest of `--tokens` prompt tokens (B1's is 512) encoded with the
bus codec, carrying its send time; the sender waits `--gap-ms` between messages, so each
finds its receiver waiting, as a request's messages find the processes on its way to a first
token. Figures per mode: the hop's p50 / p90 / mean in microseconds, send to decoded in the
receiver's loop (one clock: CLOCK_MONOTONIC is the host's).

    python -m tessera.benchmarks.bench_hop [--out PATH] [--messages 1000] [--tokens 512]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from multiprocessing import get_context
from typing import Any

import numpy as np
import zmq

from tessera.benchmarks.common import git_commit, machine, versions
from tessera.bus.channel import Inbox, Outbox
from tessera.bus.codec import decode
from tessera.bus.messages import DetokInfo, SamplingParams, TokenizedRequest

MODES = ("socket", "spin", "thread", "poll")
WARMUP = 100


def _message(tokens: int, rid: str = "hop") -> TokenizedRequest:
    return TokenizedRequest(rid=rid, input_ids=np.arange(tokens, dtype=np.int32),
                            sampling=SamplingParams(max_tokens=1), detok=DetokInfo(reply_to=""))


class _End:
    """One process's receiving end (own) or sending socket (peer), in one of MODES."""

    def __init__(self, mode: str, own: str | None, peer: str | None) -> None:
        self.mode = mode
        self.inbox: Inbox | None = None
        self.out: Outbox | None = None
        self.pending: list[Any] = []  # what a drain took beyond the message asked for
        if own is not None and mode in ("thread", "poll"):
            self.inbox = Inbox(own, name="hop", busy_poll_s=0.02 if mode == "poll" else 0.0)
        elif own is not None:
            self.pull: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PULL)
            self.pull.setsockopt(zmq.LINGER, 0)
            self.pull.bind(own)
        if peer is not None:
            self.out = Outbox(peer)

    def send(self, msg: TokenizedRequest) -> None:
        assert self.out is not None
        self.out.send(msg)

    def recv(self, timeout_s: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout_s
        if self.inbox is not None:
            while not self.pending and time.monotonic() < deadline:
                self.pending += self.inbox.drain(1.0)  # all that came, in order
            if self.pending:
                return self.pending.pop(0)
            raise TimeoutError(f"{self.mode}: nothing came within {timeout_s:.0f} s")
        if self.mode == "spin":
            while time.monotonic() < deadline:
                try:
                    return decode(self.pull.recv_multipart(zmq.NOBLOCK, copy=False))
                except zmq.Again:
                    continue
        elif self.pull.poll(int(timeout_s * 1000)):
            return decode(self.pull.recv_multipart(copy=False))
        raise TimeoutError(f"{self.mode}: nothing came within {timeout_s:.0f} s")

    def close(self) -> None:
        if self.inbox is not None:
            self.inbox.close()
        if self.out is not None:
            self.out.close()


def _receive(mode: str, own: str, count: int, out_path: str) -> None:
    """The receiving process: `count` messages, each one's hop (send time to decoded here)
    written to out_path, one number a line."""
    end = _End(mode, own, None)
    hops = []
    for i in range(count):
        try:
            msg = end.recv()
        except TimeoutError:
            raise TimeoutError(f"{mode}: {i} of {count} messages came") from None
        hops.append((time.perf_counter() - float(msg.rid)) * 1e6)
    with open(out_path, "w") as f:
        f.write("\n".join(f"{h:.2f}" for h in hops))
    end.close()


def hops(mode: str, run_dir: str, count: int, tokens: int, gap_s: float) -> list[float]:
    """Microseconds of `count` hops (after WARMUP) in this mode."""
    b = f"ipc://{run_dir}/{mode}-b"
    out_path = os.path.join(run_dir, f"{mode}.txt")
    peer = get_context("spawn").Process(target=_receive,
                                        args=(mode, b, count + WARMUP, out_path))
    peer.start()
    end = _End("socket", None, b)
    time.sleep(1.0)  # the receiver bound and connected to
    try:
        for _ in range(count + WARMUP):
            time.sleep(gap_s)
            end.send(_message(tokens, f"{time.perf_counter():.9f}"))
        peer.join(timeout=60)
    finally:
        if peer.is_alive():
            peer.kill()
        end.close()
    if peer.exitcode != 0:
        raise RuntimeError(f"{mode}: the receiving process exited with {peer.exitcode}")
    with open(out_path) as f:
        return [float(v) for v in f.read().split()][WARMUP:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_hop", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(
        __file__)), "results", "hop.json"))
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--gap-ms", type=float, default=2.0)
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args(argv)
    run_dir = tempfile.mkdtemp(prefix="tessera-hop-")
    figures: dict[str, Any] = {}
    try:
        for mode in args.modes.split(","):
            if mode not in MODES:
                parser.error(f"unknown mode {mode!r} (modes: {', '.join(MODES)})")
            t0 = time.monotonic()
            times = sorted(hops(mode, run_dir, args.messages, args.tokens, args.gap_ms / 1000))
            figures[mode] = {"hop_us": {"p50": round(statistics.median(times), 1),
                                        "p90": round(times[int(0.9 * (len(times) - 1))], 1),
                                        "mean": round(statistics.fmean(times), 1)}}
            print(f"[hop] {mode}: {figures[mode]['hop_us']} us ({time.monotonic() - t0:.1f} s)",
                  file=sys.stderr)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    result = {"benchmark": "hop", "workload": "C2 (bus part): one message to a process "
              "waiting for it", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": machine(), "commit": os.environ.get("TESSERA_COMMIT") or git_commit(),
              "versions": versions(), "config": {"messages": args.messages, "tokens": args.tokens,
                                                 "gap_ms": args.gap_ms, "transport": "ipc"},
              "figures": figures}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
