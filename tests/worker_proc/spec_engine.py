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
    # verifies sent while the same sequence's plain decode (or prompt chunk) was in flight,
    # their input that decode's token (-1)
    chained_after_decode: int = 0


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
    sent: deque[Any] = deque()  # the batches of `pending`
    table = sched.st.req_to_token
    while sched.has_work() or sched.inflight:
        while (fb := sched.next_batch()) is not None:
            if sent:
                out.chained_after_decode += _chained_after_decode(fb, sent[-1])
            pending.append(runner.launch(_through_codec(fb), table))
            sent.append(fb)
        assert pending, "work left but nothing planned"
        res = _through_codec(runner.finish(pending.popleft()))
        sent.popleft()
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


def _chained_after_decode(fb: Any, before: Any) -> int:
    """Rows of `fb` that verify with input -1 while `before` (in flight) samples one token
    for them."""
    if not fb.draft_lens.shape[0]:
        return 0
    starts = np.cumsum(fb.extend_lens) - fb.extend_lens
    chained = fb.rows[(fb.input_ids[starts] < 0) & (fb.draft_lens > 0)]
    sampled = before.rows[before.sample.astype(bool)]
    if before.draft_lens.shape[0]:
        sampled = before.rows[before.sample.astype(bool) & (before.draft_lens == 0)]
    return int(np.isin(chained, sampled).sum())
