"""The offline engine: the same scheduler and workers as `tessera serve`, driven from Python.

    from tessera import LLM, SamplingParams
    with LLM(model="default", max_total_tokens=8192) as llm:
        outs = llm.generate(["The capital of France is", [1, 2, 3]],
                            SamplingParams(temperature=0, max_tokens=16))
        print(outs[0].text, outs[1].token_ids)

    engine = Engine(model="default")                # asyncio use
    result = await engine.generate("Hello", SamplingParams(max_tokens=8))
    async for delta in engine.stream("Hello"): ...

The engine's processes (workers, scheduler, detokenizer, tokenizers) run as child processes
under one supervisor (`offline_launch.py`); requests go through the ZeroMQ client library, so
offline and online share every line of the engine.
"""

from __future__ import annotations

import asyncio
import atexit
import sys
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from tessera.bus.messages import SamplingParams
from tessera.config import READY_TIMEOUT_S, Env, ServerConfig
from tessera.offline_launch import EngineProcesses

PromptInput = str | Sequence[int] | Sequence[dict[str, Any]] | np.ndarray
SamplingInput = SamplingParams | dict[str, Any] | None
T = TypeVar("T")


@dataclass
class RequestResult:
    """One finished request. `text`, `token_ids`, `finish_reason` are the first choice's (the
    only one when n == 1); `choices` holds all n. Times are seconds, measured by the caller's
    process from the moment the request was sent; `token_times` (one per output token of the
    first choice, when streamed) give TTFT and inter-token latencies."""

    rid: str
    text: str
    token_ids: list[int]
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    e2e_s: float
    decode_steps: int = 0  # engine steps that gave the completion tokens (all choices)
    ttft_s: float | None = None
    token_times: list[float] = field(default_factory=list)
    choices: list[Any] = field(default_factory=list)

    @property
    def tokens_per_step(self) -> float:
        """Completion tokens per engine step: the mean acceptance length with speculative
        decoding (1.0 without; 0.0 when unknown)."""
        return self.completion_tokens / self.decode_steps if self.decode_steps else 0.0

    @property
    def itl_s(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]


def make_config(model: str, engine_args: dict[str, Any]) -> ServerConfig:
    """ServerConfig from keyword engine arguments, with a quiet default log level. As for
    `tessera serve`, TESSERA_HAL and TESSERA_LOG_LEVEL apply where no argument is given."""
    env = Env.read()
    values = {"log_level": env.log_level or "warning", **engine_args, "model": model}
    if values.get("hal") is None and env.hal:
        values["hal"] = env.hal
    try:
        return ServerConfig(**values)
    except TypeError as exc:
        import dataclasses

        names = sorted(f.name for f in dataclasses.fields(ServerConfig))
        raise TypeError(f"{exc}; engine arguments are EngineConfig fields: "
                        f"{', '.join(names)}") from None


def normalize_prompts(prompts: PromptInput | Sequence[PromptInput]) -> list[PromptInput]:
    """One prompt (text, token ids, chat messages) or a list of them -> a list of prompts."""
    if isinstance(prompts, str | np.ndarray):
        return [prompts]
    if isinstance(prompts, Sequence) and prompts:
        first = prompts[0]
        if isinstance(first, int | np.integer) or isinstance(first, dict):
            return [prompts]  # type: ignore[list-item]  # token ids or chat messages of one request
        return list(prompts)  # type: ignore[arg-type]
    raise ValueError("prompts must be a string, token ids, chat messages, or a non-empty list "
                     "of those")


def per_request(sampling: SamplingInput | Sequence[SamplingInput], n: int) -> list[SamplingInput]:
    if isinstance(sampling, list | tuple):
        if len(sampling) != n:
            raise ValueError(f"got {len(sampling)} sampling parameter sets for {n} prompts; "
                             f"give one, or one per prompt")
        return list(sampling)
    return [sampling] * n  # type: ignore[list-item]


async def run_request(client: Any, prompt: PromptInput, sampling: SamplingInput,
                      stream: bool) -> RequestResult:
    """Send one request through an AsyncClient and collect its result and timings."""
    from tessera.bus import trace
    from tessera.client.outputs import ResultBuilder

    t0 = time.perf_counter()
    out = await client.start(prompt, sampling, stream=stream)
    builder = ResultBuilder(out.rid, out.n)
    token_times: list[float] = []
    async with out:
        async for delta in out:
            now = time.perf_counter() - t0
            if not token_times and trace.active():
                trace.note("first", "caller", "delta", rid=out.rid)
            if delta.index == 0:
                token_times += [now] * len(delta.token_ids)
            builder.add(delta)
    e2e = time.perf_counter() - t0
    res = builder.result()
    first = res.choices[0]
    return RequestResult(
        rid=res.rid, text=first.text, token_ids=list(first.token_ids),
        finish_reason=first.finish_reason, prompt_tokens=res.usage.prompt_tokens,
        completion_tokens=res.usage.completion_tokens, cached_tokens=res.usage.cached_tokens,
        decode_steps=res.usage.decode_steps, e2e_s=e2e, ttft_s=token_times[0] if stream and token_times else None,
        token_times=token_times if stream else [], choices=res.choices)


# Engines not shut down yet: stopped at interpreter exit (atexit runs while threads still
# work), since a garbage-collected engine cannot stop its processes safely during shutdown.
_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


@atexit.register
def _shutdown_live_engines() -> None:
    for engine in list(_LIVE):
        try:
            engine.shutdown()
        except Exception:  # noqa: BLE001 - exiting: the supervisor stops on its own anyway
            pass


class _EngineBase:
    """Starts the engine's processes, or (`connect_to=RUN_DIR`) attaches to an engine that
    is already running (a `tessera serve` run) and leaves it running on shutdown.

    `shutdown()` (or `with`) stops them; an engine left running is stopped at interpreter
    exit, or when it is garbage-collected."""

    def __init__(self, model: str = "default", *,
                 ready_timeout_s: float = READY_TIMEOUT_S["worker"],
                 connect_to: str | None = None, **engine_args: Any) -> None:
        self.config = make_config(model, engine_args)
        self.processes: EngineProcesses | None = None
        if connect_to is not None:
            self.run_dir = str(connect_to)
        else:
            self.processes = EngineProcesses(self.config, ready_timeout_s)
            self.run_dir = self.processes.run_dir
        _LIVE.add(self)

    def _stop_processes(self) -> None:
        _LIVE.discard(self)
        if getattr(self, "_tracing", False):
            from tessera.bus import trace

            trace.stop()
            self._tracing = False
        processes = getattr(self, "processes", None)
        if processes is not None and processes.alive:
            processes.stop()

    def shutdown(self) -> None:
        raise NotImplementedError

    def __del__(self) -> None:
        # During interpreter shutdown threads and pipes are half torn down; the supervisor
        # child stops the engine by itself when our end of its stdin closes.
        if sys.is_finalizing():
            return
        try:
            self.shutdown()
        except Exception:  # noqa: BLE001 - a destructor must not raise
            pass

    def _new_client(self) -> Any:
        from tessera.bus import trace
        from tessera.client.async_client import AsyncClient

        if not trace.active() and self.config.trace_messages_dir:
            trace.start(self.config.trace_messages_dir, "offline")
            self._tracing = True  # this engine started the trace: it stops it
        return AsyncClient(self.run_dir, self.config, process_name="offline")

    def status(self) -> dict[str, dict[str, Any]]:
        """The supervisor's view of every process: {name: {alive, pid, age_s, stats}}."""
        from tessera.client.sync_client import Client

        with Client(self.run_dir, self.config, watch_engine=False) as client:
            return client.status().processes


# What the blocking LLM changes in the engine's defaults (an argument given wins). Its batches
# have no stream whose next token a user waits on, so a step prefills a whole chunk beside its
# decodes (serving protects decodes with --max-mixed-step-ratio 1.8): an H200's B2 at b45623a
# made 1081-1099 steps at 10447-10452 output tok/s this way, against 1248-1329 steps at
# 9178-9782 with serving's ratio (two runs of each, alternating, in one session).
LLM_DEFAULTS: dict[str, Any] = {"max_mixed_step_ratio": 0.0}


def llm_engine_args(engine_args: dict[str, Any]) -> dict[str, Any]:
    """The engine arguments an LLM starts with: LLM_DEFAULTS under the caller's."""
    return {**LLM_DEFAULTS, **engine_args}


class LLM(_EngineBase):
    """Blocking offline engine. `generate` sends every prompt at once, so the scheduler
    batches them continuously, and returns results in the order of the prompts. Its steps
    prefill whole chunks beside running decodes (`LLM_DEFAULTS`): throughput, not the
    streams' latency, is what an offline batch is for."""

    def __init__(self, model: str = "default", **engine_args: Any) -> None:
        super().__init__(model, **llm_engine_args(engine_args))
        # The AsyncClient lives on a private event loop in a thread: `generate` is blocking and
        # may be called from code that has (or has not) an event loop of its own.
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tessera-offline",
                                        daemon=True)
        self._thread.start()
        self._client = self._call(self._make_client())

    async def _make_client(self) -> Any:
        return self._new_client()

    def _call(self, coro: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()  # type: ignore[arg-type]

    def generate(self, prompts: PromptInput | Sequence[PromptInput],
                 sampling_params: SamplingInput | Sequence[SamplingInput] = None, *,
                 use_tqdm: bool = True, stream: bool = False,
                 on_result: Callable[[int, RequestResult], None] | None = None,
                 ) -> list[RequestResult]:
        """Generate for one prompt or a list (text, token ids or chat messages), with one
        SamplingParams for all or one per prompt. `stream=True` records per-token times
        (TTFT, ITL) at the cost of a message per step per request."""
        batch = normalize_prompts(prompts)
        params = per_request(sampling_params, len(batch))
        bar = _progress(len(batch), use_tqdm)
        results: list[RequestResult | None] = [None] * len(batch)

        async def one(i: int) -> None:
            results[i] = await run_request(self._client, batch[i], params[i], stream)
            bar.update(1)
            if on_result is not None:
                on_result(i, results[i])  # type: ignore[arg-type]

        async def all_of() -> None:
            tasks = [asyncio.ensure_future(one(i)) for i in range(len(batch))]
            try:
                await asyncio.gather(*tasks)
            except BaseException:
                # One failed (or we were cancelled): abort the others in the engine too.
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise

        future: Future[None] = asyncio.run_coroutine_threadsafe(all_of(), self._loop)
        try:
            future.result()
        except BaseException:
            future.cancel()  # cancelling the tasks aborts their requests in the engine
            raise
        finally:
            bar.close()
        return [r for r in results if r is not None]

    def shutdown(self) -> None:
        if getattr(self, "_client", None) is not None:
            try:
                self._call(self._close_client())
            except Exception:
                pass
            self._client = None
        if getattr(self, "_loop", None) is None:
            self._stop_processes()  # the constructor failed before the loop existed
            return
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        self._stop_processes()

    async def _close_client(self) -> None:
        self._client.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


class Engine(_EngineBase):
    """Asyncio offline engine. Construction blocks until the engine is ready; the client is
    created on first use inside the caller's event loop."""

    def __init__(self, model: str = "default", **engine_args: Any) -> None:
        super().__init__(model, **engine_args)
        self._client: Any = None

    def _get_client(self) -> Any:
        if self._client is None:
            self._client = self._new_client()
        return self._client

    async def generate(self, prompt: PromptInput, sampling_params: SamplingInput = None, *,
                       stream_timings: bool = False) -> RequestResult:
        return await run_request(self._get_client(), prompt, sampling_params, stream_timings)

    async def stream(self, prompt: PromptInput,
                     sampling_params: SamplingInput = None) -> AsyncIterator[Any]:
        """Deltas (text, token_ids, finish_reason, usage) as the engine produces them."""
        out = await self._get_client().start(prompt, sampling_params, stream=True)
        async with out:
            async for delta in out:
                yield delta

    def shutdown(self) -> None:
        if getattr(self, "_client", None) is not None:
            self._client.close()
            self._client = None
        self._stop_processes()

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.shutdown()


def _progress(total: int, enabled: bool) -> Any:
    import sys

    from tqdm import tqdm

    return tqdm(total=total, desc="Generating", unit="req", file=sys.stderr,
                disable=not enabled or total <= 1, mininterval=0.5)
