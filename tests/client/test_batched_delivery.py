"""The receiver thread opens a RequestOutputBatch into its requests' outputs and wakes an
event loop once for all of them, in order; outputs of unknown requests are dropped and a
damaged batch is counted, not fatal."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import numpy as np

from tessera.bus.channel import Outbox
from tessera.bus.messages import RequestOutput
from tessera.bus.output_batch import pack_outputs
from tessera.bus.run_paths import RunPaths
from tessera.client.connection import BusConnection, LoopSink
from tessera.client.request import BoundedSink


def _out(rid: str, k: int) -> RequestOutput:
    return RequestOutput(rid=rid, index=0, text=f"t{k}", token_ids=np.array([k], np.int32))


def test_one_batch_many_streams_one_wakeup(paths: RunPaths) -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        conn = BusConnection(paths, watch_engine=False)
        queues = {f"r{i}": asyncio.Queue() for i in range(5)}
        for rid, queue in queues.items():  # wrapped as open_request wraps every sink
            conn.register(rid, BoundedSink(conn, rid, LoopSink(loop, queue), limit=100))
        box = Outbox(conn.endpoint)
        try:
            for step in range(2):
                rows = [_out(rid, step) for rid in queues] + [_out("unknown", step)]
                box.send(pack_outputs(rows))
                deadline = time.monotonic() + 5
                while any(q.qsize() <= step for q in queues.values()):
                    assert time.monotonic() < deadline, "outputs did not arrive"
                    await asyncio.sleep(0.01)
            for queue in queues.values():
                assert [(await queue.get()).text for _ in range(2)] == ["t0", "t1"]
            assert conn.received == 2 and conn.loop_wakeups == 2
            bad = dataclasses.replace(pack_outputs([_out("r0", 9)]), texts=[])
            box.send(bad)
            deadline = time.monotonic() + 5
            while conn.dropped == 0:
                assert time.monotonic() < deadline, "the damaged batch was not counted"
                await asyncio.sleep(0.01)
            assert queues["r0"].empty()
        finally:
            box.close()
            conn.close()

    asyncio.run(run())
