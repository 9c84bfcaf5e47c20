"""Bus benchmark: messages/s and latency through a 4-hop chain of real processes.

    driver --PUSH--> relay1 --> relay2 --> relay3 --PUSH--> driver      (4 hops, ipc://)

Every relay decodes each message and encodes it again, as an engine process does. Three paths
run in the same invocation, on the same message (a TokenizedRequest whose token ids carry the
payload), 1 KB and 1 MB:
  - zero_copy: the bus codec (msgpack header, arrays as separate frames sent with copy=False,
    decoded with numpy.frombuffer on the received frame);
  - codec_copy: the same codec over copying sends and receives (shows what the zero-copy
    frames save, apart from the codec itself);
  - pickle_copy: BASELINE ONLY, the naive design the bus replaces: pickle.dumps / pickle.loads
    of the whole message and copying sends. Never do this on a real socket (a pickled message
    is remote code execution); here both ends are this benchmark's own processes.

Figures: messages/s with the chain saturated; latency p50/p99 with one message in flight
(and under the saturating load). The result JSON goes to benchmarks/results/bus.json.

    python -m tessera.benchmarks.bench_bus [--out PATH] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle  # the labelled baseline only, see the module docstring
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import zmq

from tessera.benchmarks.common import git_commit, machine, summarize, versions
from tessera.bus.codec import decode, encode
from tessera.bus.messages import DetokInfo, SamplingParams, TokenizedRequest

MODES = ("zero_copy", "codec_copy", "pickle_copy")
PAYLOADS = {"1KB": 1 << 10, "1MB": 1 << 20}
# (messages for throughput, messages for latency) per payload; --quick divides them by 10.
COUNTS = {"1KB": (15_000, 1_500), "1MB": (500, 200)}
HWM = {"1KB": 1000, "1MB": 32}
WINDOW = {"1KB": 256, "1MB": 16}  # messages in flight while measuring throughput
RELAYS = 3


# --------------------------------------------------------------------------------------------
# The two ways of putting a message on a socket and taking it off again
# --------------------------------------------------------------------------------------------


def send_zero_copy(sock: zmq.Socket, msg: TokenizedRequest) -> None:
    sock.send_multipart(encode(msg), copy=False)


def recv_zero_copy(sock: zmq.Socket) -> TokenizedRequest:
    return decode(sock.recv_multipart(copy=False))  # type: ignore[return-value]


def send_codec_copy(sock: zmq.Socket, msg: TokenizedRequest) -> None:
    sock.send_multipart(encode(msg), copy=True)


def recv_codec_copy(sock: zmq.Socket) -> TokenizedRequest:
    return decode(sock.recv_multipart(copy=True))  # type: ignore[return-value]


def send_pickle(sock: zmq.Socket, msg: TokenizedRequest) -> None:
    sock.send(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL), copy=True)


def recv_pickle(sock: zmq.Socket) -> TokenizedRequest:
    # BASELINE ONLY: unpickling socket data is unsafe; both peers are this benchmark.
    return pickle.loads(sock.recv(copy=True))  # type: ignore[no-any-return]


CODECS: dict[str, tuple[Callable[[zmq.Socket, TokenizedRequest], None],
                        Callable[[zmq.Socket], TokenizedRequest]]] = {
    "zero_copy": (send_zero_copy, recv_zero_copy),
    "codec_copy": (send_codec_copy, recv_codec_copy),
    "pickle_copy": (send_pickle, recv_pickle),
}


def relay(src: str, dst: str, mode: str, hwm: int) -> None:
    """One hop of the chain: receive, decode, encode, send on, forever."""
    send, recv = CODECS[mode]
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    for sock in (pull, push):
        sock.setsockopt(zmq.SNDHWM, hwm)
        sock.setsockopt(zmq.RCVHWM, hwm)
        sock.setsockopt(zmq.LINGER, 0)
    pull.bind(src)
    push.connect(dst)
    while True:
        send(push, recv(pull))


# --------------------------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------------------------


class Chain:
    """Relay processes for one mode and payload, with the driver's two ends."""

    def __init__(self, run_dir: str, mode: str, hwm: int) -> None:
        eps = [f"ipc://{run_dir}/{mode}-{i}.sock" for i in range(RELAYS + 1)]
        self.procs = [subprocess.Popen(
            [sys.executable, "-m", "tessera.benchmarks.bench_bus", "--relay", eps[i],
             eps[i + 1], mode, str(hwm)]) for i in range(RELAYS)]
        self.ctx = zmq.Context()
        self.sink = self.ctx.socket(zmq.PULL)
        self.source = self.ctx.socket(zmq.PUSH)
        for sock in (self.sink, self.source):
            sock.setsockopt(zmq.SNDHWM, hwm)
            sock.setsockopt(zmq.RCVHWM, hwm)
            sock.setsockopt(zmq.LINGER, 0)
        self.sink.bind(eps[-1])
        self.source.connect(eps[0])
        self.send, self.recv = CODECS[mode]

    def close(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        self.source.close()
        self.sink.close()
        self.ctx.term()


def since(received: TokenizedRequest) -> float:
    """Milliseconds from the send to now (the message carries its send time)."""
    return (time.perf_counter() - received.arrival_time) * 1e3


def measure(chain: Chain, msg: TokenizedRequest, n_throughput: int, n_latency: int,
            window: int) -> dict[str, Any]:
    chain.sink.setsockopt(zmq.RCVTIMEO, 30_000)  # a relay that died fails the run, not hangs
    for _ in range(20):  # warm-up: the chain is connected and every relay has imported
        chain.send(chain.source, replace(msg, arrival_time=time.perf_counter()))
        chain.recv(chain.sink)

    unloaded: list[float] = []
    for _ in range(n_latency):
        chain.send(chain.source, replace(msg, arrival_time=time.perf_counter()))
        unloaded.append(since(chain.recv(chain.sink)))

    # Saturate the chain from one thread, keeping `window` messages in flight: a second
    # thread would make the driver's two ends fight over the GIL and measure that instead.
    loaded: list[float] = []
    sent = 0
    t0 = time.perf_counter()
    while len(loaded) < n_throughput:
        if sent < n_throughput and sent - len(loaded) < window:
            chain.send(chain.source, replace(msg, arrival_time=time.perf_counter()))
            sent += 1
        else:
            loaded.append(since(chain.recv(chain.sink)))
    elapsed = time.perf_counter() - t0
    nbytes = msg.input_ids.nbytes
    return {
        "msgs_per_s": round(n_throughput / elapsed, 1),
        "payload_mb_per_s": round(n_throughput * nbytes / elapsed / 1e6, 1),
        "latency_ms": {k: round(v, 4) for k, v in summarize(unloaded).items()},
        "latency_under_load_ms": {k: round(v, 4) for k, v in summarize(loaded).items()},
    }


def run(quick: bool) -> dict[str, Any]:
    run_dir = tempfile.mkdtemp(prefix="tessera-bench-")
    os.chmod(run_dir, 0o700)
    figures: dict[str, dict[str, Any]] = {mode: {} for mode in MODES}
    try:
        for label, size in PAYLOADS.items():
            ids = np.arange(size // 4, dtype=np.int32)
            msg = TokenizedRequest(rid="bench", input_ids=ids, sampling=SamplingParams(),
                                   detok=DetokInfo(reply_to="ipc://nowhere"))
            n_tp, n_lat = COUNTS[label]
            if quick:
                n_tp, n_lat = n_tp // 10, n_lat // 10
            for mode in MODES:
                chain = Chain(run_dir, mode, HWM[label])
                try:
                    figures[mode][label] = measure(chain, msg, n_tp, n_lat, WINDOW[label])
                finally:
                    chain.close()
                print(f"{mode:>12} {label:>4}: {figures[mode][label]['msgs_per_s']:>10.1f} msg/s"
                      f"  p50 {figures[mode][label]['latency_ms']['p50']:.3f} ms"
                      f"  p99 {figures[mode][label]['latency_ms']['p99']:.3f} ms", flush=True)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    speedup = {label: round(figures["zero_copy"][label]["msgs_per_s"]
                            / figures["pickle_copy"][label]["msgs_per_s"], 2)
               for label in PAYLOADS}
    return {
        "benchmark": "bus",
        "workload": "C2 (bus part): messages through a 4-hop chain of processes",
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "device": "cpu",
        "commit": git_commit(),
        "versions": versions(),
        "config": {"hops": RELAYS + 1, "relays": RELAYS, "transport": "ipc", "quick": quick,
                   "payload_bytes": PAYLOADS, "counts": COUNTS, "hwm": HWM,
                   "window": WINDOW,
                   "message": "TokenizedRequest, payload in input_ids (int32)"},
        "figures": {**figures, "speedup_msgs_per_s": speedup,
                    "target_2x_at_1MB_met": speedup["1MB"] >= 2.0},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_bus", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(
        __file__)), "results", "bus.json"), help="result JSON (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="a tenth of the messages")
    parser.add_argument("--relay", nargs=4, metavar=("SRC", "DST", "MODE", "HWM"),
                        help=argparse.SUPPRESS)  # internal: run as one hop of the chain
    args = parser.parse_args(argv)
    if args.relay:
        src, dst, mode, hwm = args.relay
        relay(src, dst, mode, int(hwm))
        return 0
    result = run(args.quick)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(f"speed-up of the zero-copy path: {result['figures']['speedup_msgs_per_s']}"
          f"  -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
