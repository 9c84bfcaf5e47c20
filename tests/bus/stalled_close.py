"""Run as a child by test_channel: `python -m tests.bus.stalled_close N`.

N times: an Outbox fills a peer that never reads with large multipart messages (back-pressure,
a half-sent message in flight), then both ends close at the same moment. libzmq aborts the
process in that case unless the Outbox lingers on close; surviving prints "survived N".
"""

from __future__ import annotations

import shutil
import sys
import tempfile

import numpy as np
import zmq

from tessera.bus.channel import Outbox, SendTimeout
from tessera.bus.messages import SampledTokens


def main(rounds: int) -> None:
    folder = tempfile.mkdtemp(prefix="tsr-")
    payload = SampledTokens(step=0, token_ids=np.zeros(1 << 16, dtype=np.int32))
    peer_context = zmq.Context()  # the peer is another process in real life: its own I/O
    try:
        for i in range(rounds):
            endpoint = f"ipc://{folder}/peer{i}.sock"
            pull = peer_context.socket(zmq.PULL)
            pull.setsockopt(zmq.RCVHWM, 4)
            pull.bind(endpoint)
            out = Outbox(endpoint, timeout_ms=20, hwm=4)
            try:
                for _ in range(10_000):
                    out.send(payload)
            except SendTimeout:
                pass
            out.close()
            pull.close(linger=0)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"survived {rounds}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
