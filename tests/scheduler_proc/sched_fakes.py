"""An in-process fake worker and a driver loop for scheduler tests.

The fake "model" reads the KV it is given: every step it writes each new token (and its
position) into a simulated arena at the slots the shared page table names, reads the whole
row back, checks that every position holds what was written for it, and samples a token that
is a pure function of the tokens it read (and the seed). A request's output is therefore fixed
by its prompt alone, whatever the schedule: `reference_output` recomputes it without any
scheduler, so a wrong page, a stale cache entry or a lost token shows up as a different output.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tessera.bus.messages import (
    DetokInfo,
    ForwardBatch,
    SampledTokens,
    SamplingParams,
    TokenBatch,
    TokenizedRequest,
)
from tessera.scheduler_proc.scheduler import Scheduler

VOCAB = 50
EOS = 0


def next_token(tokens: np.ndarray, seed: int, blocked: set[int], vocab: int = VOCAB) -> int:
    n = tokens.shape[0]
    h = (int(tokens[-1]) * 1103515245 + n * 12345 + int(tokens.astype(np.int64).sum()) * 31
         + (seed if seed >= 0 else 0) * 7919) % (2**31)
    tok = h % vocab
    while tok in blocked:
        tok = (tok + 1) % vocab
    return tok


Model = Callable[[np.ndarray, int, set[int]], int]


def reference_output(prompt: np.ndarray, sp: SamplingParams, index: int, max_total: int,
                     eos: tuple[int, ...] = (EOS,), model: Model = next_token
                     ) -> tuple[list[int], str]:
    """What a correct scheduler must produce for sample `index`, computed directly."""
    seq = [int(t) for t in prompt]
    out: list[int] = []
    seed = -1 if sp.seed is None else sp.seed + index
    stops = set(sp.stop_token_ids) | (set() if sp.ignore_eos else set(eos))
    while True:
        blocked = stops if len(out) < sp.min_tokens else set()
        tok = model(np.asarray(seq), seed, blocked)
        out.append(tok)
        seq.append(tok)
        if tok in stops:
            return out, "stop"
        if len(seq) >= max_total:
            return out, "length"


class FakeWorker:
    """Runs ForwardBatches on the simulated arena. A request with proposals
    (ForwardBatch.draft_lens) samples after its input and after each proposal and keeps the
    proposals equal to its samples, up to the first that is not, and the sample after them."""

    def __init__(self, sched: Scheduler | None = None, *, req_to_token: np.ndarray | None = None,
                 page_size: int = 0, num_slots: int = 0, model: Model = next_token,
                 refer_back: bool = True) -> None:
        """`refer_back` False: like a pipeline's first stage, the worker cannot resolve an
        input id -1 (a token still in flight) and fails the test if it gets one."""
        self.model = model
        if sched is not None:
            req_to_token, page_size = sched.st.req_to_token, sched.page_size
            num_slots = sched.config.num_slots
        assert req_to_token is not None
        self.r2t = req_to_token
        self.page_size = page_size
        n = num_slots
        self.kv_tok = np.full(n, -7, dtype=np.int64)
        self.kv_pos = np.full(n, -1, dtype=np.int64)
        self.last: dict[int, int] = {}
        self.steps = 0
        self.refer_back = refer_back

    def step(self, fb: ForwardBatch) -> SampledTokens:
        out: list[int] = []
        counts: list[int] = []
        off = 0
        for i in range(fb.batch_size):
            row, seq_len, ext = int(fb.rows[i]), int(fb.seq_lens[i]), int(fb.extend_lens[i])
            ids = fb.input_ids[off:off + ext].astype(np.int64)
            off += ext
            drafts = int(fb.draft_lens[i]) if fb.draft_lens.shape[0] else 0
            if (ids < 0).any():
                assert self.refer_back, f"step {fb.step}: a -1 input the worker cannot resolve"
                # Only the first: a decode's input, or a chained verify's (the token the
                # row's previous verify kept last).
                assert (ids[1:] >= 0).all() and row in self.last, \
                    "a -1 input that is not a decode's first, or for a row that never sampled"
                ids = ids.copy()
                ids[0] = self.last[row]
            slots = self.r2t[row, seq_len - ext:seq_len]
            assert (slots >= self.page_size).all(), "a slot of the reserved page 0"
            self.kv_tok[slots] = ids
            self.kv_pos[slots] = np.arange(seq_len - ext, seq_len)
            every = self.r2t[row, :seq_len]
            assert (self.kv_pos[every] == np.arange(seq_len)).all(), \
                f"row {row}: KV positions do not match (step {fb.step})"
            if fb.sample[i]:
                blocked: set[int] = set()
                if fb.block_offsets.shape[0]:
                    blocked = set(fb.block_ids[fb.block_offsets[i]:fb.block_offsets[i + 1]]
                                  .tolist())
                    assert not (drafts and blocked), "proposals while tokens are blocked"
                got: list[int] = []
                for j in range(drafts + 1):  # sample after the input and each proposal
                    end = seq_len - drafts + j
                    tok = self.model(self.kv_tok[self.r2t[row, :end]], int(fb.seeds[i]),
                                     blocked)
                    got.append(tok)
                    if j == drafts or int(ids[ext - drafts + j]) != tok:
                        break
                self.last[row] = got[-1]
                out.extend(got)
                counts.append(len(got))
        assert off == fb.input_ids.shape[0]
        self.steps += 1
        if not fb.draft_lens.shape[0]:
            counts = []
        return SampledTokens(step=fb.step, token_ids=np.asarray(out, dtype=np.int32),
                             counts=np.asarray(counts, dtype=np.int32))


@dataclass
class Collected:
    tokens: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    finish: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    cached: dict[tuple[str, int], int] = field(default_factory=dict)
    announced: dict[str, int] = field(default_factory=dict)

    def add(self, tb: TokenBatch | None) -> None:
        if tb is None:
            return
        for rid in tb.new_requests:
            self.announced[rid] = self.announced.get(rid, 0) + 1
        off = 0
        for r, rid in enumerate(tb.rids):
            key = (rid, tb.indices[r])
            assert rid in self.announced, f"{rid} appeared before its DetokInfo"
            count = int(tb.counts[r])
            self.tokens.setdefault(key, []).extend(tb.token_ids[off:off + count].tolist())
            off += count
            self.cached[key] = tb.cached_tokens[r]
            if tb.finish[r] is not None:
                self.finish.setdefault(key, []).append(tb.finish[r])  # type: ignore[arg-type]
        assert off == tb.token_ids.shape[0]


def make_request(rid: str, prompt: list[int] | np.ndarray, **sampling: object) -> TokenizedRequest:
    return TokenizedRequest(rid=rid, input_ids=np.asarray(prompt, dtype=np.int32),
                            sampling=SamplingParams(**sampling),  # type: ignore[arg-type]
                            detok=DetokInfo(reply_to=f"ipc://nowhere/{rid}"))


def drive(sched: Scheduler, worker: FakeWorker, collected: Collected, max_steps: int = 100_000,
          check: bool = True, between=None) -> int:
    """Run until idle: send batches up to the pipeline depth, answer them in order."""
    results: deque[SampledTokens] = deque()
    steps = 0
    while sched.has_work() or sched.inflight:
        while (fb := sched.next_batch()) is not None:
            results.append(worker.step(fb))
        if not results:
            raise AssertionError("work left but no batch planned: the scheduler is stuck")
        collected.add(sched.on_result(results.popleft()))
        collected.add(sched.take_output())
        if check:
            sched.check_invariant()
            assert sched.stats()["kv_invariant_ok"] == 1.0
        steps += 1
        if between is not None:
            between(steps)
        assert steps < max_steps, "did not finish"
    collected.add(sched.take_output())  # aborts made by `between` after the last step
    return steps
