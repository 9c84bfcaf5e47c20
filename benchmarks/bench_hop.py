"""What one hop of the bus costs on this host: a message from one process to another that
was waiting for it, received one of four ways.

    socket   a PULL socket read by the process's own thread, blocking (the transport alone:
             ZeroMQ's I/O thread on each side)
    spin     the same socket read without blocking, in a loop (no thread is woken to take
             the message: the floor a busy-polling receiver would reach)
    thread   the Inbox (bus/channel.py) with TESSERA_INBOX_DIRECT=0: its receiver thread
             decodes the message into the double buffer and the loop, blocked in drain(),
             is woken to take it
    inbox    the Inbox as the engine runs it: the loop, waiting in drain(), waits on the
             socket itself and takes the message there

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
from tessera.bus.codec import decode, encode
from tessera.bus.messages import DetokInfo, SamplingParams, TokenizedRequest

MODES = ("socket", "spin", "thread", "inbox")
WARMUP = 100


def _message(tokens: int, rid: str = "hop") -> TokenizedRequest:
    return TokenizedRequest(rid=rid, input_ids=np.arange(tokens, dtype=np.int32),
                            sampling=SamplingParams(max_tokens=1), detok=DetokInfo(reply_to=""))


class _End:
    """One process's receiving end and its sending socket, in one of MODES."""

    def __init__(self, mode: str, own: str, peer: str) -> None:
        self.mode = mode
        if mode in ("thread", "inbox"):
            self.inbox: Inbox | None = Inbox(own, name="hop", direct=mode == "inbox")
            self.out: Outbox | None = Outbox(peer)
            return
        self.inbox = self.out = None
        ctx = zmq.Context.instance()
        self.pull = ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.LINGER, 0)
        self.pull.bind(own)
        self.push = ctx.socket(zmq.PUSH)
        self.push.setsockopt(zmq.LINGER, 0)
        self.push.connect(peer)

    def send(self, msg: TokenizedRequest) -> None:
        if self.out is not None:
            self.out.send(msg)
        else:
            self.push.send_multipart(encode(msg), copy=False)

    def recv(self) -> Any:
        if self.inbox is not None:
            while True:
                got = self.inbox.drain(None)
                if got:
                    return got[0]
        if self.mode == "spin":
            while True:
                try:
                    return decode(self.pull.recv_multipart(zmq.NOBLOCK, copy=False))
                except zmq.Again:
                    continue
        return decode(self.pull.recv_multipart(copy=False))

    def close(self) -> None:
        if self.inbox is not None and self.out is not None:
            self.inbox.close()
            self.out.close()


def _receive(mode: str, own: str, peer: str, count: int, out_path: str) -> None:
    """The receiving process: `count` messages, each one's hop (send time to decoded here)
    written to out_path, one number a line, then a message back (the end)."""
    end = _End(mode, own, peer)
    hops = []
    for _ in range(count):
        msg = end.recv()
        hops.append((time.perf_counter() - float(msg.rid)) * 1e6)
    with open(out_path, "w") as f:
        f.write("\n".join(f"{h:.2f}" for h in hops))
    end.send(_message(1, "done"))
    time.sleep(0.2)  # let it leave before the sockets close
    end.close()


def hops(mode: str, run_dir: str, count: int, tokens: int, gap_s: float) -> list[float]:
    """Microseconds of `count` hops (after WARMUP) in this mode."""
    a, b = f"ipc://{run_dir}/{mode}-a", f"ipc://{run_dir}/{mode}-b"
    out_path = os.path.join(run_dir, f"{mode}.txt")
    peer = get_context("spawn").Process(target=_receive,
                                        args=(mode, b, a, count + WARMUP, out_path))
    peer.start()
    end = _End(mode, a, b)
    time.sleep(1.0)  # both ends bound and connected
    try:
        for _ in range(count + WARMUP):
            time.sleep(gap_s)
            msg = _message(tokens, f"{time.perf_counter():.9f}")
            end.send(msg)
        end.recv()  # the receiver's end
        peer.join(timeout=10)
    finally:
        if peer.is_alive():
            peer.kill()
        end.close()
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
            times = sorted(hops(mode, run_dir, args.messages, args.tokens, args.gap_ms / 1000))
            figures[mode] = {"hop_us": {"p50": round(statistics.median(times), 1),
                                        "p90": round(times[int(0.9 * (len(times) - 1))], 1),
                                        "mean": round(statistics.fmean(times), 1)}}
            print(f"[hop] {mode}: {figures[mode]['hop_us']} us", file=sys.stderr)
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
