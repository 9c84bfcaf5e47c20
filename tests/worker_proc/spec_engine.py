"""The real scheduler driving a real ModelRunner in one process (no bus): requests in, tokens
out, with overlap (step n+1 launched before step n's result is applied) as the processes do.
For speculative-decoding tests, where the scheduler and the worker must agree on every
proposal, slot and count."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tessera.bus import codec
from tessera.bus.messages import DetokInfo, Message, SamplingParams, TokenizedRequest
from tessera.scheduler_proc.config import SchedulerConfig
from tessera.scheduler_proc.scheduler import Scheduler


@dataclass
class Outputs:
    tokens: dict[str, list[int]] = field(default_factory=dict)
    finish: dict[str, str] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)  # steps that gave each request tokens
    logprobs: dict[str, list[float]] = field(default_factory=dict)
    stats: dict[str, float] = field(default_factory=dict)


def _through_codec(msg: Message) -> Any:
    return codec.decode(codec.encode(msg))


def generate(runner: Any, requests: dict[str, tuple[list[int], SamplingParams]],
             **batching: Any) -> Outputs:
    """Run every request to its end; `batching`: SchedulerConfig fields over the runner's."""
    cfg = SchedulerConfig.from_engine(runner.config.replace(**batching),
                                      runner.ready_message())
    sched = Scheduler(cfg)
    for rid, (prompt, sp) in requests.items():
        err = sched.add_request(TokenizedRequest(
            rid=rid, input_ids=np.asarray(prompt, dtype=np.int32), sampling=sp,
            detok=DetokInfo(reply_to="ipc://nowhere")))
        assert err is None, err
    out = Outputs()
    pending: deque[Any] = deque()
    table = sched.st.req_to_token
    while sched.has_work() or sched.inflight:
        while (fb := sched.next_batch()) is not None:
            pending.append(runner.launch(_through_codec(fb), table))
        assert pending, "work left but nothing planned"
        res = _through_codec(runner.finish(pending.popleft()))
        tb = sched.on_result(res)
        if tb is None:
            continue
        off = 0
        for r, rid in enumerate(tb.rids):
            n = int(tb.counts[r])
            out.tokens.setdefault(rid, []).extend(tb.token_ids[off:off + n].tolist())
            if tb.logprobs.shape[0]:
                out.logprobs.setdefault(rid, []).extend(tb.logprobs[off:off + n].tolist())
            off += n
            if n:
                out.steps[rid] = out.steps.get(rid, 0) + 1
            if tb.finish[r] is not None:
                out.finish[rid] = tb.finish[r]  # type: ignore[assignment]
    sched.check_invariant()
    assert sched.allocator.free_pages + sched.cache.evictable_pages == \
        sched.allocator.total_pages
    out.stats = sched.stats()
    return out
