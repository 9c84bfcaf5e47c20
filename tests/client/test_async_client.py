"""AsyncClient: the same behaviour on asyncio, plus abort on task cancellation."""

from __future__ import annotations

import asyncio

import pytest

from tessera.bus.run_paths import RunPaths
from tessera.client import AsyncClient, AsyncStream, GenerateResult, PromptTooLongError
from tessera.client.testing import FakeEngine, token_text
from tessera.config import EngineConfig


def run(coro):  # noqa: ANN001, ANN201
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_async_generate_and_stream(paths: RunPaths, config: EngineConfig,
                                   engine: FakeEngine) -> None:
    async def main() -> None:
        client = AsyncClient(paths, config)
        try:
            result = await client.generate("hi", max_tokens=3)
            assert isinstance(result, GenerateResult) and result.text == "w0 w1 w2"
            stream = await client.generate("hi", stream=True, n=2, max_tokens=2)
            assert isinstance(stream, AsyncStream)
            deltas = [d async for d in stream]
            for i in range(2):
                assert [d.text for d in deltas if d.index == i] == \
                    [token_text(0, i), token_text(1, i)]
            with pytest.raises(PromptTooLongError):
                await client.generate("FAIL_413")
            status = await client.status()
            assert status.ready
        finally:
            client.close()
    run(main())


def test_many_concurrent_streams_stay_in_order(paths: RunPaths, config: EngineConfig,
                                               engine: FakeEngine) -> None:
    async def one(client: AsyncClient, k: int) -> list[str]:
        stream = await client.start(f"prompt {k}", max_tokens=6)
        return [d.text async for d in stream]

    async def main() -> None:
        client = AsyncClient(paths, config)
        try:
            outs = await asyncio.gather(*(one(client, k) for k in range(32)))
        finally:
            client.close()
        assert all(o == [token_text(k, 0) for k in range(6)] for o in outs)
    run(main())


def test_cancelling_the_consumer_aborts_the_request(paths: RunPaths, config: EngineConfig,
                                                    engine: FakeEngine) -> None:
    async def main() -> str:
        client = AsyncClient(paths, config)
        try:
            stream = await client.start("hi", max_tokens=10_000, ignore_eos=True)

            async def consume() -> None:
                async for _ in stream:
                    pass
            task = asyncio.create_task(consume())
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(200):
                if any(a.rid == stream.rid for a in engine.aborts):
                    break
                await asyncio.sleep(0.01)
            assert client.conn.in_flight() == 0
            return stream.rid
        finally:
            client.close()
    rid = run(main())
    assert any(a.rid == rid for a in engine.aborts)


def test_async_with_closes_the_client(paths: RunPaths, config: EngineConfig,
                                      engine: FakeEngine) -> None:
    async def main() -> AsyncClient:
        async with AsyncClient(paths, config) as client:
            assert (await client.generate("hi", max_tokens=2)).text == "w0 w1"
        return client
    client = run(main())
    assert client.conn._stop.is_set()  # closed: its receiver thread was told to stop


def test_a_missing_run_directory_is_a_clear_error(run_root) -> None:  # noqa: ANN001
    from tessera.client import Client, EngineNotFoundError

    where = run_root / "nothing-here"
    with pytest.raises(EngineNotFoundError, match="run directory") as info:
        Client(str(where))
    assert info.value.status == 503 and str(where) in info.value.message

    async def main() -> None:
        async with AsyncClient(str(where)):
            pass
    with pytest.raises(EngineNotFoundError, match="does not exist"):
        run(main())
