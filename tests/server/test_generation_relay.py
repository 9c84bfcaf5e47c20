"""Generation.relay writes the SSE events of every delta already at hand in one socket write,
and writes at once when nothing more is waiting (no delta is held back for a later one)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from tessera.client import Delta
from tessera.server.generation import Generation


class Stream:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[Delta | None] = asyncio.Queue()

    def ready(self) -> bool:
        return not self.queue.empty()

    async def deltas(self) -> AsyncIterator[tuple[int, Delta]]:
        while (delta := await self.queue.get()) is not None:
            yield delta.index, delta


class Writer:
    """SseWriter's buffering: `send` queues, `flush` writes what is queued."""

    def __init__(self) -> None:
        self.pending: list[str] = []
        self.writes: list[list[str]] = []

    async def send(self, obj: dict[str, Any]) -> None:
        self.pending.append(obj["text"])

    async def flush(self) -> None:
        if self.pending:
            self.writes.append(self.pending)
            self.pending = []


def _delta(text: str) -> Delta:
    return Delta(rid="r", index=0, text=text, token_ids=(1,))


def test_deltas_at_hand_share_a_write_and_a_lone_delta_is_written_at_once() -> None:
    async def run() -> list[list[str]]:
        gen = Generation(state=None)  # type: ignore[arg-type]
        stream = Stream()
        gen.streams = [stream]  # type: ignore[list-item]
        gen._iter = stream.deltas()
        sse = Writer()

        async def emit(index: int, delta: Delta) -> None:
            await sse.send({"text": delta.text})

        for text in ("a", "b", "c"):  # a burst: three deltas arrive together
            stream.queue.put_nowait(_delta(text))
        relay = asyncio.create_task(gen.relay(sse, None, emit))  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        assert sse.writes == [["a", "b", "c"]]
        stream.queue.put_nowait(_delta("d"))  # alone: written without waiting for more
        await asyncio.sleep(0.05)
        assert sse.writes[-1] == ["d"]
        stream.queue.put_nowait(None)
        assert await relay is True
        return sse.writes

    assert asyncio.run(run()) == [["a", "b", "c"], ["d"]]
