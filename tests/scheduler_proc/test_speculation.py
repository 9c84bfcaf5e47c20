"""Speculative decoding in the scheduler, against the fake worker: whatever is proposed, every
request gets exactly the tokens of the model computed one token at a time; pages of rejected
proposals go back; the page invariant holds after every step.

The fake model here copies: it continues the latest earlier occurrence of its last two tokens
(so prompt lookup finds real proposals), except that seeded requests deviate now and then (a
hash of the context decides), so their proposals are accepted for a few tokens, then
rejected."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.bus.messages import ForwardBatch, SampledTokens
from tessera.scheduler_proc.config import SchedulerConfig
from tessera.scheduler_proc.ngram import NgramIndex, continuation
from tessera.scheduler_proc.scheduler import Scheduler
from tests.scheduler_proc.sched_fakes import (
    EOS,
    VOCAB,
    Collected,
    FakeWorker,
    drive,
    make_request,
    next_token,
    reference_output,
)
from tests.scheduler_proc.test_scheduler_random import run_schedule


def copying(tokens: np.ndarray, seed: int, blocked: set[int]) -> int:
    """Unseeded: always copies when it can. Seeded: deviates a fifth of the time."""
    n = tokens.shape[0]
    h = next_token(tokens, seed, set())
    tok = h
    if n >= 3 and (seed < 0 or h % 5 != 0):
        a, b = int(tokens[-2]), int(tokens[-1])
        hits = np.flatnonzero((tokens[:n - 2] == a) & (tokens[1:n - 1] == b))
        if hits.shape[0]:
            tok = int(tokens[hits[-1] + 2])
    while tok in blocked:
        tok = (tok + 1) % VOCAB
    return tok


def spec_config(**kw: object) -> dict[str, object]:
    return {"speculative_algorithm": "ngram", "speculative_num_draft_tokens": 4,
            "speculative_ngram_min": 1, "speculative_ngram_max": 3, **kw}


# ------------------------------------------------------------------------------ prompt lookup

def test_ngram_index_finds_the_latest_longest_match() -> None:
    t = np.array([5, 6, 7, 1, 5, 6, 8, 2, 6, 9, 5, 6], dtype=np.int32)
    index = NgramIndex(1, 3)
    index.catch_up(t, t.shape[0])
    # suffix "5 6" occurred at 0 and 4: the latest (followed by 8 at 6) wins
    assert index.match(t, t.shape[0]) == 6
    # t[:9] ends "8 2 6": neither "8 2 6" nor "2 6" occurred before, "6" did (latest: at 5)
    short = NgramIndex(1, 3)
    short.catch_up(t, 9)
    assert short.match(t, 9) == 6
    # nothing earlier: -1
    fresh = NgramIndex(2, 3)
    u = np.array([1, 2, 3, 4], dtype=np.int32)
    fresh.catch_up(u, 4)
    assert fresh.match(u, 4) == -1


def test_ngram_index_catches_up_lazily_and_equals_a_full_rebuild() -> None:
    rng = np.random.default_rng(0)
    t = rng.integers(0, 6, size=200).astype(np.int32)
    lazy = NgramIndex(2, 4)
    for length in range(1, 201, 7):
        lazy.catch_up(t, length)
        full = NgramIndex(2, 4)
        full.catch_up(t, length)
        assert lazy.latest == full.latest
        got = lazy.match(t, length)
        # brute force: the longest suffix (4..2) with an earlier occurrence, the latest one
        want = -1
        for n in (4, 3, 2):
            if length <= n:
                continue
            suffix = t[length - n:length]
            hits = [e for e in range(n, length) if (t[e - n:e] == suffix).all()]
            if hits:
                want = hits[-1]
                break
        assert got == want, length


def test_continuation_runs_periodically_into_itself() -> None:
    t = np.array([9, 1, 2, 1, 2], dtype=np.int32)
    assert continuation(t, 5, 3, 5).tolist() == [1, 2, 1, 2, 1]
    assert continuation(t, 5, 1, 3).tolist() == [1, 2, 1]


# ------------------------------------------------------------------------------ schedules

@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_random_schedules_with_ngram_speculation_match_the_model(seed: int,
                                                                 overlap: bool) -> None:
    sched = run_schedule(seed, overlap, num_pages=48, model=copying, **spec_config())
    stats = sched.stats()
    assert stats["spec_verify_steps_total"] > 20
    assert 0 < stats["spec_accepted_tokens_total"] < stats["spec_draft_tokens_total"]
    assert sched.retracted_total > 0  # pages were short: proposals and retractions met


def test_roomy_pool_speculation_accepts_more_than_one_token_a_step() -> None:
    sched = run_schedule(5, True, num_pages=2000, n_requests=30, model=copying,
                         **spec_config())
    assert sched.stats()["spec_accept_length"] > 1.5


class DraftingWorker(FakeWorker):
    """The worker side of --speculative-algorithm draft: it overwrites the placeholder
    proposals with its own draft model's greedy tokens (here: the copying model with every
    seventh proposal spoiled)."""

    def step(self, fb: ForwardBatch) -> SampledTokens:
        if fb.draft_lens.shape[0] and fb.draft_lens.any():
            ids = fb.input_ids.copy()
            off = 0
            for i in range(fb.batch_size):
                ext, d = int(fb.extend_lens[i]), int(fb.draft_lens[i])
                if d:
                    row, seq_len = int(fb.rows[i]), int(fb.seq_lens[i])
                    ctx = list(self.kv_tok[self.r2t[row, :seq_len - d - 1]])
                    ctx.append(int(ids[off]))
                    for j in range(d):
                        tok = copying(np.asarray(ctx), int(fb.seeds[i]), set())
                        if (len(ctx) + j) % 7 == 0:
                            tok = (tok + 1) % VOCAB
                        ids[off + 1 + j] = tok
                        ctx.append(tok)
                off += ext
            object.__setattr__(fb, "input_ids", ids)
        return super().step(fb)


@pytest.mark.parametrize("overlap", [False, True])
def test_worker_proposals_reserve_slots_and_match_the_model(overlap: bool) -> None:
    sched = run_schedule(3, overlap, num_pages=48, model=copying, worker_class=DraftingWorker,
                         **spec_config(speculative_algorithm="draft"))
    stats = sched.stats()
    assert stats["spec_verify_steps_total"] > 20
    assert stats["spec_accept_length"] > 2.0


def _scheduler(**kw: object) -> Scheduler:
    ps = 4
    cfg = SchedulerConfig(num_slots=ps * 200, page_size=ps, max_context_len=256,
                          max_running_requests=8, chunked_prefill_size=64,
                          eos_token_ids=(EOS,), debug_invariants=True,
                          **spec_config(**kw))  # type: ignore[arg-type]
    return Scheduler(cfg)


def test_a_batch_accepts_different_lengths_and_ends_mid_proposal() -> None:
    """Four requests decoding together: one repeating a short period (long acceptance), one
    whose copy deviates (short), one whose stop token lies inside accepted proposals, one whose
    max_tokens ends between proposals."""
    sched = _scheduler()
    worker = FakeWorker(sched, model=copying)
    got = Collected()
    period = [7, 8, 9, 10, 11]
    prompts = {
        "periodic": period * 6,
        "mixed": [3, 4, 5, 6, 3, 4, 12, 13, 3, 4, 5, 6, 3, 4],
        "stops": period * 6,
        "short": period * 6,
    }
    params = {"periodic": {"max_tokens": 40}, "mixed": {"max_tokens": 30, "seed": 3},
              "stops": {"max_tokens": 40, "stop_token_ids": (10,), "min_tokens": 1},
              "short": {"max_tokens": 7}}
    for rid, prompt in prompts.items():
        assert sched.add_request(make_request(rid, prompt, **params[rid])) is None
    counts_seen: dict[str, set[int]] = {rid: set() for rid in prompts}
    last_count: dict[str, int] = {}
    original_add = got.add

    def add(tb):  # type: ignore[no-untyped-def]
        if tb is not None:
            for r, rid in enumerate(tb.rids):
                counts_seen[rid].add(int(tb.counts[r]))
                last_count[rid] = int(tb.counts[r])
        original_add(tb)

    got.add = add  # type: ignore[method-assign]
    drive(sched, worker, got)
    for rid, prompt in prompts.items():
        req = make_request(rid, prompt, **params[rid])
        max_total = len(prompt) + params[rid]["max_tokens"]  # type: ignore[operator]
        want, why = reference_output(req.input_ids, req.sampling, 0, max_total, model=copying)
        assert got.tokens[(rid, 0)] == want, rid
        assert got.finish[(rid, 0)] == [why], rid
    assert max(counts_seen["periodic"]) == 5  # k + 1 tokens in one step
    assert got.finish[("stops", 0)] == ["stop"] and got.tokens[("stops", 0)] == [7, 8, 9, 10]
    # the stop token was the second of four proposals, all accepted: the rest were dropped
    assert last_count["stops"] == 2
    assert len(got.tokens[("short", 0)]) == 7
    assert len({max(c) for c in counts_seen.values()}) > 1 or \
        counts_seen["mixed"] != counts_seen["periodic"]
    assert not sched.running and sched.stats()["kv_invariant_ok"] == 1.0
    assert sched.allocator.free_pages + sched.cache.evictable_pages == \
        sched.allocator.total_pages


def test_rejected_proposals_give_their_pages_back_at_once() -> None:
    """A verify whose proposals cross into new pages and are all rejected frees those pages
    when its result is applied."""
    sched = _scheduler(speculative_num_draft_tokens=8)
    # The model continues the prompt's period once (so that prompt lookup proposes), then
    # never again: every proposal is rejected.
    worker = FakeWorker(sched, model=lambda t, s, b: 20 if t.shape[0] == 16 else
                        30 + t.shape[0] % 5)
    got = Collected()
    prompt = [20, 21, 22, 23] * 4  # page size 4: proposals of 8 take 2-3 more pages
    assert sched.add_request(make_request("r", prompt, max_tokens=12)) is None
    free0 = sched.allocator.free_pages
    fb = sched.next_batch()  # the prefill
    assert fb is not None
    got.add(sched.on_result(worker.step(fb)))
    fb = sched.next_batch()
    assert fb is not None and fb.draft_lens.shape[0] and int(fb.draft_lens[0]) == 8
    held = free0 - sched.allocator.free_pages
    assert held >= 6  # 17 prompt+token slots plus 8 proposals at page size 4
    got.add(sched.on_result(worker.step(fb)))
    row = int(fb.rows[0])
    kv = int(sched.st.kv_len[row])
    assert kv == len(prompt) + 1  # the verify's input stays, no proposal does
    assert int(sched.st.n_pages[row]) == -(-kv // 4)
    assert free0 - sched.allocator.free_pages == -(-kv // 4)
    sched.check_invariant()
    # the back-off: the next steps do not propose
    fb = sched.next_batch()
    assert fb is not None and not fb.draft_lens.shape[0]


def test_no_proposals_for_penalties_grammar_or_min_tokens_left() -> None:
    sched = _scheduler()
    worker = FakeWorker(sched, model=copying)
    got = Collected()
    prompt = [7, 8, 9] * 10
    assert sched.add_request(make_request("pen", prompt, max_tokens=20,
                                          repetition_penalty=1.2)) is None
    assert sched.add_request(make_request("min", prompt, max_tokens=20, min_tokens=6)) is None
    verified: dict[str, list[int]] = {"pen": [], "min": []}
    while sched.has_work() or sched.inflight:
        fb = sched.next_batch()
        assert fb is not None
        if fb.draft_lens.shape[0]:
            for i, row in enumerate(fb.rows.tolist()):
                rid = sched.running.rid_of_row[row]
                if fb.draft_lens[i]:
                    verified[rid].append(int(sched.st.n_known[row] - len(prompt)))
        got.add(sched.on_result(worker.step(fb)))
    assert verified["pen"] == []
    assert verified["min"] and min(verified["min"]) >= 6
    for rid in ("pen", "min"):
        assert len(got.tokens[(rid, 0)]) == 20


def test_speculation_off_sends_no_draft_lens() -> None:
    ps = 4
    cfg = SchedulerConfig(num_slots=ps * 100, page_size=ps, max_context_len=128,
                          max_running_requests=4, eos_token_ids=(EOS,))
    sched = Scheduler(cfg)
    assert sched.spec is None
    worker = FakeWorker(sched, model=copying)
    got = Collected()
    assert sched.add_request(make_request("r", [7, 8, 9] * 8, max_tokens=10)) is None
    while sched.has_work() or sched.inflight:
        fb = sched.next_batch()
        assert fb is not None and not fb.draft_lens.shape[0]
        got.add(sched.on_result(worker.step(fb)))
    assert "spec_verify_steps_total" not in sched.stats()


def copying_with_slips(tokens: np.ndarray, seed: int, blocked: set[int]) -> int:
    """Copies; a seeded request slips every 13th position (after long runs of copying)."""
    tok = copying(tokens, -1, blocked)
    if seed >= 0 and tokens.shape[0] % 13 == 0:
        tok = (tok + 1) % VOCAB
        while tok in blocked:
            tok = (tok + 1) % VOCAB
    return tok


def test_verifies_chain_while_one_is_in_flight_and_void_on_a_rejection() -> None:
    """With overlap, a sequence whose verify is in flight verifies again in the step built
    meanwhile (its input the token in flight, -1), guessing that every proposal is kept. A
    sequence that keeps copying has a verify in flight at every step; one whose copy deviates
    now and then (seeded) has chained steps made void, whose results are ignored and whose
    slots are rolled back. Both get exactly the model's tokens."""
    sched = _scheduler(overlap=True)
    worker = FakeWorker(sched, model=copying_with_slips)
    got = Collected()
    period = [7, 8, 9, 10, 11]
    prompts = {"periodic": period * 6, "deviating": [3, 4, 5, 6, 12] * 6}
    params: dict[str, dict[str, object]] = {"periodic": {"max_tokens": 60},
                                            "deviating": {"max_tokens": 60, "seed": 3}}
    for rid, prompt in prompts.items():
        assert sched.add_request(make_request(rid, prompt, **params[rid])) is None
    results: list[SampledTokens] = []
    chained_inputs = 0
    while sched.has_work() or sched.inflight:
        while (fb := sched.next_batch()) is not None:
            if fb.draft_lens.shape[0]:
                starts = np.cumsum(fb.extend_lens) - fb.extend_lens
                chained_inputs += int(((fb.input_ids[starts] < 0) & (fb.draft_lens > 0)).sum())
            results.append(worker.step(fb))
        got.add(sched.on_result(results.pop(0)))
        sched.check_invariant()
    for rid, prompt in prompts.items():
        req = make_request(rid, prompt, **params[rid])
        max_total = len(prompt) + int(params[rid]["max_tokens"])  # type: ignore[call-overload]
        want, _ = reference_output(req.input_ids, req.sampling, 0, max_total,
                                   model=copying_with_slips)
        assert got.tokens[(rid, 0)] == want, rid
    stats = sched.stats()
    assert stats["spec_chained_steps_total"] == chained_inputs > 3
    assert stats["spec_void_steps_total"] > 0
    assert stats["spec_verify_steps_total"] > 0
    assert not sched.running and sched.stats()["kv_invariant_ok"] == 1.0
    assert sched.allocator.free_pages + sched.cache.evictable_pages == \
        sched.allocator.total_pages


def test_a_copying_sequence_alone_keeps_a_step_in_flight() -> None:
    """Batch 1, a sequence that keeps every proposal: once a verify has kept all its
    proposals, every step is built while the one before it runs (the worker never waits for
    the scheduler). The first verify has no such record: the second waits for its result."""
    sched = _scheduler(overlap=True)
    worker = FakeWorker(sched, model=copying)
    got = Collected()
    prompt = [7, 8, 9, 10, 11] * 6
    assert sched.add_request(make_request("r", prompt, max_tokens=41)) is None
    results: list[SampledTokens] = []
    alone: list[bool] = []  # per verify planned: nothing else was in flight
    while sched.has_work() or sched.inflight:
        while (fb := sched.next_batch()) is not None:
            if fb.draft_lens.shape[0]:
                alone.append(len(sched.inflight) == 1)
            results.append(worker.step(fb))
        got.add(sched.on_result(results.pop(0)))
    assert got.tokens[("r", 0)] == (prompt * 3)[len(prompt):len(prompt) + 41]
    assert len(alone) == 8 and alone[:2] == [True, True] and not any(alone[2:])
