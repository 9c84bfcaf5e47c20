"""What the sync and async clients share: building a GenerateRequest from the caller's
arguments, and the per-request state machine that turns replies into deltas or errors."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from tessera.bus.messages import ErrorReply, GenerateRequest, RequestOutput, SamplingParams
from tessera.client.connection import BusConnection, Item
from tessera.client.errors import BadRequestError, TesseraError, from_reply
from tessera.client.outputs import Delta, delta_from_output

Prompt = str | Sequence[dict[str, Any]] | Sequence[int] | np.ndarray | None


def coerce_sampling(sampling: SamplingParams | dict[str, Any] | None,
                    overrides: dict[str, Any]) -> SamplingParams:
    """SamplingParams from an object, a dict and/or keyword overrides; invalid → 400."""
    if sampling is None:
        values: dict[str, Any] = {}
    elif isinstance(sampling, SamplingParams):
        values = sampling.to_dict()
    elif isinstance(sampling, dict):
        values = dict(sampling)
    else:
        raise BadRequestError(f"sampling must be SamplingParams or a dict, got "
                              f"{type(sampling).__name__}", param="sampling")
    values.update(overrides)
    try:
        params = SamplingParams.from_dict(values)
    except (TypeError, ValueError) as exc:
        raise BadRequestError(f"{exc}; see SamplingParams for the accepted names") from None
    problem = params.validate()
    if problem:
        raise BadRequestError(problem, param=problem.split(" ", 1)[0])
    return params


def build_request(conn: BusConnection, prompt: Prompt, sampling: SamplingParams, *,
                  messages: Sequence[dict[str, Any]] | None, input_ids: Any, stream: bool,
                  rid: str | None, priority: int = 0,
                  add_generation_prompt: bool = True) -> GenerateRequest:
    """One GenerateRequest: `prompt` may be text, chat messages (a list of dicts) or token ids
    (a list of ints / int array); exactly one form must be given."""
    if prompt is not None:
        if isinstance(prompt, str):
            pass
        elif isinstance(prompt, np.ndarray) or (
                isinstance(prompt, Sequence) and prompt and all(
                    isinstance(t, int | np.integer) and not isinstance(t, bool) for t in prompt)):
            if input_ids is not None:
                raise BadRequestError("give the token ids once: as prompt or as input_ids")
            input_ids, prompt = prompt, None
        elif isinstance(prompt, Sequence) and prompt and all(isinstance(m, dict) for m in prompt):
            if messages is not None:
                raise BadRequestError("give the chat messages once: as prompt or as messages")
            messages, prompt = list(prompt), None  # type: ignore[arg-type]
        else:
            raise BadRequestError("prompt must be a string, a non-empty list of chat messages "
                                  "or a non-empty list of token ids", param="prompt")
    given = sum(x is not None for x in (prompt, messages, input_ids))
    if given != 1:
        raise BadRequestError("give exactly one of prompt, messages or input_ids")
    ids = None
    if input_ids is not None:
        ids = np.asarray(input_ids)
        if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
            raise BadRequestError("input_ids must be a non-empty list of integers",
                                  param="input_ids")
        if ids.min() < 0 or ids.max() > np.iinfo(np.int32).max:
            raise BadRequestError("input_ids must be non-negative token ids", param="input_ids")
        ids = ids.astype(np.int32)
    return GenerateRequest(
        rid=rid or uuid.uuid4().hex, reply_to=conn.endpoint, sampling=sampling, prompt=prompt,
        messages=list(messages) if messages is not None else None, input_ids=ids,
        stream=stream, priority=priority, add_generation_prompt=add_generation_prompt,
        arrival_time=time.time())


class RequestTracker:
    """State of one request as its replies arrive: which choices have finished, whether the
    engine answered at all (a breaker success), and what to raise on an error."""

    def __init__(self, conn: BusConnection, rid: str, n: int) -> None:
        self.conn = conn
        self.rid = rid
        self.n = n
        self.answered = False
        self.finished: set[int] = set()
        self.failed = False

    @property
    def done(self) -> bool:
        return self.failed or len(self.finished) >= self.n

    def feed(self, item: Item) -> Delta:
        """The delta in `item`; raises the matching TesseraError for an error."""
        if isinstance(item, TesseraError):
            self.failed = True
            raise item
        if not self.answered:
            self.answered = True
            self.conn.breaker.record_success()
        if isinstance(item, ErrorReply):
            self.failed = True
            raise from_reply(item)
        assert isinstance(item, RequestOutput)
        if not 0 <= item.index < self.n:
            self.failed = True
            raise TesseraError(f"the engine answered choice {item.index} of a request with "
                               f"n={self.n}", status=500)
        if item.finish_reason is not None:
            self.finished.add(item.index)
        return delta_from_output(item)

    def timed_out(self) -> None:
        self.failed = True
        self.conn.breaker.record_failure("timeout")

    def close(self) -> None:
        """Stop routing replies; abort the request in the engine if it is still running."""
        self.conn.unregister(self.rid)
        if not self.done:
            self.failed = True
            self.conn.send_abort(self.rid)
