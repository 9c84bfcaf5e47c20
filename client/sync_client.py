"""`Client`: the blocking client library.

    with Client(run_dir) as client:
        print(client.generate("The capital of France is", {"max_tokens": 8}).text)
        for delta in client.generate(messages=[{"role": "user", "content": "Hi"}],
                                     stream=True, temperature=0):
            print(delta.text, end="")

Thread-safe: any number of threads may call `generate` on one Client at once.
"""

from __future__ import annotations

import os
import queue
from collections.abc import Iterator, Sequence
from typing import Any

from tessera.bus.breaker import CircuitBreaker
from tessera.bus.config import EngineConfig, RunPaths
from tessera.bus.messages import SamplingParams, StatusReply
from tessera.bus.process import load_config
from tessera.client.connection import BusConnection, Item
from tessera.client.errors import RequestTimeoutError, UnavailableError
from tessera.client.outputs import Delta, GenerateResult, ResultBuilder
from tessera.client.request import Prompt, RequestTracker, build_request, coerce_sampling


def _paths(run_dir: str | RunPaths) -> RunPaths:
    return run_dir if isinstance(run_dir, RunPaths) else RunPaths(run_dir=str(run_dir))


def engine_config(run_dir: str | RunPaths, config: EngineConfig | None) -> EngineConfig:
    """The given config, else the running engine's own (its run directory's config.json:
    timeouts, tokenizer workers), else the defaults."""
    if config is not None:
        return config
    paths = _paths(run_dir)
    if os.path.isfile(paths.config_file):
        return load_config(paths)
    return EngineConfig()


def make_connection(run_dir: str | RunPaths, config: EngineConfig, *,
                    watch_engine: bool, self_name: str) -> BusConnection:
    return BusConnection(
        _paths(run_dir), send_timeout_ms=config.send_timeout_ms,
        breaker=CircuitBreaker("engine", config.breaker_failures, config.breaker_cooldown_s),
        watch_engine=watch_engine, status_interval_s=min(0.5, config.heartbeat_interval_s),
        silence_timeout_s=config.heartbeat_timeout_s, self_name=self_name,
        tokenizer_workers=config.tokenizer_workers)


class Stream:
    """The deltas of one streaming request, in order. Leaving the loop early (break, an
    exception, `close()`) aborts the request in the engine."""

    def __init__(self, tracker: RequestTracker, replies: queue.SimpleQueue[Item],
                 first_timeout_s: float, inter_timeout_s: float) -> None:
        self.rid = tracker.rid
        self._tracker = tracker
        self._replies = replies
        self._first_timeout_s = first_timeout_s
        self._inter_timeout_s = inter_timeout_s

    def __iter__(self) -> Iterator[Delta]:
        return self

    def __next__(self) -> Delta:
        tracker = self._tracker
        if tracker.done:
            tracker.close()
            raise StopIteration
        timeout = self._inter_timeout_s if tracker.answered else self._first_timeout_s
        try:
            item = self._replies.get(timeout=timeout)
        except queue.Empty:
            tracker.timed_out()
            tracker.conn.send_abort(self.rid, "timeout")
            tracker.close()
            what = "output" if not tracker.answered else "further output"
            raise RequestTimeoutError(f"no {what} from the engine within {timeout:g} s; the "
                                      f"request was aborted") from None
        try:
            return tracker.feed(item)
        except BaseException:
            tracker.close()
            raise

    def close(self) -> None:
        self._tracker.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._tracker.close()
        except Exception:  # interpreter shutdown: sockets may already be gone
            pass


class Client:
    """Blocking client of a running engine, addressed by its run directory."""

    def __init__(self, run_dir: str | RunPaths, config: EngineConfig | None = None, *,
                 request_timeout_s: float | None = None,
                 first_output_timeout_s: float | None = None,
                 watch_engine: bool = True, process_name: str = "") -> None:
        config = engine_config(run_dir, config)
        self.config = config
        self.inter_timeout_s = request_timeout_s or config.request_timeout_s
        self.first_timeout_s = first_output_timeout_s or self.inter_timeout_s
        self.conn = make_connection(run_dir, config, watch_engine=watch_engine,
                                    self_name=process_name)

    def generate(self, prompt: Prompt = None,
                 sampling: SamplingParams | dict[str, Any] | None = None, *,
                 messages: Sequence[dict[str, Any]] | None = None, input_ids: Any = None,
                 stream: bool = False, rid: str | None = None, priority: int = 0,
                 add_generation_prompt: bool = True,
                 **sampling_kwargs: Any) -> GenerateResult | Stream:
        """Generate from text, chat messages or token ids. `stream=False` returns the whole
        GenerateResult; `stream=True` returns a Stream of Deltas. Sampling parameters come
        from `sampling` and/or keywords (`max_tokens=8, temperature=0`)."""
        params = coerce_sampling(sampling, sampling_kwargs)
        self.conn.check_available()
        req = build_request(self.conn, prompt, params, messages=messages, input_ids=input_ids,
                            stream=stream, rid=rid, priority=priority,
                            add_generation_prompt=add_generation_prompt)
        replies: queue.SimpleQueue[Item] = queue.SimpleQueue()
        self.conn.register(req.rid, replies.put)
        tracker = RequestTracker(self.conn, req.rid, params.n)
        try:
            self.conn.send_generate(req)
        except BaseException:
            self.conn.unregister(req.rid)
            raise
        out = Stream(tracker, replies, self.first_timeout_s, self.inter_timeout_s)
        if stream:
            return out
        builder = ResultBuilder(req.rid, params.n)
        with out:
            for delta in out:
                builder.add(delta)
        return builder.result()

    def abort(self, rid: str) -> None:
        self.conn.send_abort(rid)

    def status(self, timeout: float = 2.0) -> StatusReply:
        """The supervisor's view of every process; UnavailableError if it does not answer."""
        box: queue.SimpleQueue[StatusReply] = queue.SimpleQueue()
        nonce = self.conn.request_status(box.put)
        try:
            return box.get(timeout=timeout)
        except queue.Empty:
            raise UnavailableError(f"the supervisor did not answer within {timeout:g} s; "
                                   f"is the engine running?") from None
        finally:
            self.conn.forget_status_request(nonce)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
