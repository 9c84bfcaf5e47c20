"""`Client`: the blocking client library.

    with Client(run_dir) as client:
        print(client.generate("The capital of France is", {"max_tokens": 8}).text)
        for delta in client.generate(messages=[{"role": "user", "content": "Hi"}],
                                     stream=True, temperature=0):
            print(delta.text, end="")

Thread-safe: any number of threads may call `generate` on one Client at once.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator, Sequence
from typing import Any

from tessera.bus.messages import StatusReply
from tessera.client.connection import Item
from tessera.client.outputs import Delta, GenerateResult, ResultBuilder
from tessera.client.request import (
    ClientBase,
    Prompt,
    StreamBase,
    open_request,
    status_timeout_error,
)
from tessera.client.sampling import SamplingArg


class Stream(StreamBase):
    """The deltas of one streaming request, in order. Leaving the loop early (break, an
    exception, `close()`) aborts the request in the engine."""

    _replies: queue.SimpleQueue[Item]

    def __iter__(self) -> Iterator[Delta]:
        return self

    def __next__(self) -> Delta:
        tracker = self._tracker
        if tracker.done:
            tracker.close()
            raise StopIteration
        self._check_overflow()
        timeout = self._next_timeout()
        try:
            item = self._replies.get(timeout=timeout)
        except queue.Empty:
            raise self._expire(timeout) from None
        return self._feed(item)

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


class Client(ClientBase):
    """Blocking client of a running engine, addressed by its run directory."""

    def generate(self, prompt: Prompt = None,
                 sampling: SamplingArg = None, *,
                 messages: Sequence[dict[str, Any]] | None = None, input_ids: Any = None,
                 stream: bool = False, rid: str | None = None, priority: int = 0,
                 add_generation_prompt: bool = True,
                 tools: list[dict[str, Any]] | None = None,
                 chat_template_kwargs: dict[str, Any] | None = None,
                 **sampling_kwargs: Any) -> GenerateResult | Stream:
        """Generate from text, chat messages or token ids. `stream=False` returns the whole
        GenerateResult; `stream=True` returns a Stream of Deltas. Sampling parameters come
        from `sampling` and/or keywords (`max_tokens=8, temperature=0`), checked here unless
        `sampling` is a CheckedSampling (from `check_sampling`) without keywords."""
        replies: queue.SimpleQueue[Item] = queue.SimpleQueue()
        req, tracker = open_request(self.conn, prompt, sampling, sampling_kwargs, replies.put,
                                    messages=messages, input_ids=input_ids, stream=stream,
                                    rid=rid, priority=priority,
                                    add_generation_prompt=add_generation_prompt,
                                    tools=tools, chat_template_kwargs=chat_template_kwargs,
                                    buffer_limit=self.buffer_limit)
        try:
            self.conn.send_generate(req)
        except BaseException:
            self.conn.unregister(req.rid)
            raise
        out = Stream(tracker, replies, self.first_timeout_s, self.inter_timeout_s)
        if stream:
            return out
        builder = ResultBuilder(req.rid, tracker.n)
        with out:
            for delta in out:
                builder.add(delta)
        return builder.result()

    def status(self, timeout: float = 2.0) -> StatusReply:
        """The supervisor's view of every process; UnavailableError if it does not answer."""
        box: queue.SimpleQueue[StatusReply] = queue.SimpleQueue()
        nonce = self.conn.request_status(box.put)
        try:
            return box.get(timeout=timeout)
        except queue.Empty:
            raise status_timeout_error(timeout) from None
        finally:
            self.conn.forget_status_request(nonce)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
