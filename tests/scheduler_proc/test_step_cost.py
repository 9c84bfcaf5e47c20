"""StepCost: the decode step and the marginal prefill token learned from step times, and the
prefill budget that keeps a mixed step within a multiple of a decode step."""

from __future__ import annotations

import pytest

from tessera.scheduler_proc.step_cost import MIN_PREFILL_MEASURED, UNMEASURED_CHUNK, StepCost

KW = dict(cap=2048, min_tokens=256, floor=16, max_mixed_step_ratio=2.0, step_target_ms=1000.0)


def learned(decode_ms: float, per_token_ms: float, decodes: int = 32) -> StepCost:
    cost = StepCost()
    for _ in range(30):  # a device whose steps cost exactly decode_ms + P * per_token_ms
        cost.observe(decodes, 0, decode_ms)
        cost.observe(decodes, 512, decode_ms + 512 * per_token_ms)
    return cost


def test_costs_converge_to_the_devices() -> None:
    cost = learned(6.0, 0.02)
    assert cost.decode_ms == pytest.approx(6.0)
    assert cost.prefill_ms_per_token == pytest.approx(0.02)


def test_small_chunks_and_failed_steps_teach_nothing() -> None:
    cost = learned(6.0, 0.02)
    cost.observe(32, MIN_PREFILL_MEASURED - 1, 100.0)
    cost.observe(32, 0, 0.0)
    assert cost.decode_ms == pytest.approx(6.0)
    assert cost.prefill_ms_per_token == pytest.approx(0.02)


def test_a_mixed_step_is_held_to_the_ratio_of_a_decode_step() -> None:
    cost = learned(6.0, 0.02)  # an H200-like step: 300 tokens fit in one more decode step
    assert cost.prefill_budget(decodes=32, **KW) == 300
    slower = {**KW, "max_mixed_step_ratio": 1.5}
    assert cost.prefill_budget(decodes=32, **slower) == 256  # floor
    # nothing decodes: nothing to protect, the whole chunk (2048 tokens: 41 ms here)
    assert cost.prefill_budget(decodes=0, **KW) == 2048
    unprotected = {**KW, "max_mixed_step_ratio": 0.0}
    assert cost.prefill_budget(decodes=32, **unprotected) == 2048


def test_step_target_caps_prefill_work_on_a_slow_device() -> None:
    cost = learned(200.0, 2.5)  # a CPU: decodes 200 ms, prefill 2.5 ms a token
    # 1000 ms of prefill, though nothing decodes: whoever arrives waits for this step
    assert cost.prefill_budget(decodes=0, **KW) == 400
    assert cost.prefill_budget(decodes=0, **{**KW, "step_target_ms": 0.0}) == 2048
    slowest = learned(200.0, 500.0)  # the step target stops at min_tokens
    assert slowest.prefill_budget(decodes=32, **KW) == 256
    assert slowest.prefill_budget(decodes=0, **KW) == 256


def test_unmeasured_device_gets_a_first_chunk_that_measures_it() -> None:
    """A fresh or restarted engine knows nothing of its device: its first step must not be
    the whole chunk (tens of seconds on a slow CPU for anyone arriving meanwhile)."""
    assert StepCost().prefill_budget(decodes=0, **KW) == UNMEASURED_CHUNK < 2048
    assert StepCost().prefill_budget(decodes=0, **{**KW, "cap": 64}) == 64
    assert StepCost().prefill_budget(decodes=0, **{**KW, "step_target_ms": 0.0}) == 2048
    assert UNMEASURED_CHUNK >= MIN_PREFILL_MEASURED  # the first step teaches the cost
    first = StepCost()
    first.observe(0, 1024, 40.0)  # a prefill-only step, before any decode: all of it per token
    assert first.prefill_ms_per_token == pytest.approx(40.0 / 1024)


def h200_like(decodes: int) -> float:
    """A decode step that grows with the batch (more KV read): 4.3 ms alone, 9 ms at 128."""
    return 4.3 + 4.7 * decodes / 128


def test_a_mixed_step_is_charged_the_decode_step_of_its_own_batch_size() -> None:
    """Prompts keep arriving beside 128 streams, and the last decode-only steps were of 8
    streams: their decode step is not what the mixed step's decodes cost. Charged the 8
    streams' step, the prefill tokens looked 0.035 ms each; charged their own, 0.02."""
    cost = StepCost()
    for _ in range(30):
        cost.observe(128, 0, h200_like(128))
    for _ in range(30):
        cost.observe(8, 0, h200_like(8))
    assert cost.decode_ms == pytest.approx(h200_like(8), rel=1e-3)  # the latest decode step
    for _ in range(30):
        cost.observe(128, 256, h200_like(128) + 256 * 0.02)
    assert cost.prefill_ms_per_token == pytest.approx(0.02)
    # and the budget is held to the ratio of the decode step of the streams that decode
    assert cost.prefill_budget(decodes=128, **KW) == round(h200_like(128) / 0.02)
    assert cost.prefill_budget(decodes=8, **KW) == 256  # its 4.6 ms: the floor


def test_a_batch_size_not_measured_takes_the_nearest_measured() -> None:
    cost = StepCost()
    assert cost.decode_ms_at(5) == 0.0
    cost.observe(1, 0, 4.3)
    cost.observe(100, 0, 8.0)
    assert cost.decode_ms_at(1) == 4.3
    assert cost.decode_ms_at(64) == 8.0  # class of 64-127: measured
    assert cost.decode_ms_at(40) == 8.0  # 32-63: the nearest is 64-127
    assert cost.decode_ms_at(3) == 4.3  # 2-3: the nearest is 1
    assert cost.decode_ms_at(8) == 4.3  # 8-15 is as far from 1 as from 64-127: the smaller
    assert cost.decode_ms_at(256) == 8.0


def test_a_prefill_only_step_still_reads_the_weights_once() -> None:
    """Its fixed cost is a one-stream decode step's (the weights), not prefill work."""
    cost = StepCost()
    cost.observe(1, 0, 4.3)
    cost.observe(0, 512, 4.3 + 512 * 0.02)
    assert cost.prefill_ms_per_token == pytest.approx(0.02)
    # with only a 128-stream decode step measured (it reads KV besides the weights), the
    # prefill-only step is charged wholly to its tokens, not that step's 9 ms
    busy = StepCost()
    busy.observe(128, 0, 9.0)
    busy.observe(0, 512, 12.66)
    assert busy.prefill_ms_per_token == pytest.approx(12.66 / 512)


def test_a_mixed_step_of_a_batch_size_never_decoded_alone_teaches_nothing() -> None:
    """Prompts beside ever more streams, and decode-only steps of small batches only (B2's
    pattern): a 128-stream mixed step charged the 8-stream step would leave its tokens the
    KV reads of 120 more streams (0.038 ms a token here, not 0.02)."""
    cost = StepCost()
    cost.observe(8, 0, h200_like(8))
    cost.observe(8, 512, h200_like(8) + 512 * 0.02)
    assert cost.prefill_ms_per_token == pytest.approx(0.02)
    for _ in range(30):
        cost.observe(128, 256, h200_like(128) + 256 * 0.02)
    assert cost.prefill_ms_per_token == pytest.approx(0.02)
    # with nothing known yet, the first such step still gives an estimate (too high)
    first = StepCost()
    first.observe(8, 0, h200_like(8))
    first.observe(128, 256, h200_like(128) + 256 * 0.02)
    assert first.prefill_ms_per_token == pytest.approx(
        (h200_like(128) + 256 * 0.02 - h200_like(8)) / 256)
