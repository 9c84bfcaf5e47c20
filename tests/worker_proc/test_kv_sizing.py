from __future__ import annotations

import pytest

from tessera.hal.cpu import CpuPlatform
from tessera.hal.platform import MemoryPolicy
from tessera.worker_proc.kv_sizing import plan_kv

HOST = CpuPlatform.memory_policy

GIB = 1 << 30


def plan(**kw):
    args = dict(free_bytes_now=10 * GIB, free_bytes_before_weights=12 * GIB, policy=MemoryPolicy(),
                mem_fraction=0.5, max_total_tokens=None, page_size=16, bytes_per_slot=1 << 20,
                max_context_len=1 << 20, max_running_requests=256)
    args.update(kw)
    return plan_kv(**args)


def test_accelerator_budget_is_a_fraction_of_memory_before_weights():
    # 12 GiB free before, 2 GiB of weights, fraction 0.5: 6 GiB in all, 4 GiB left for KV.
    p = plan()
    assert p.num_slots == 4 * 1024 and p.num_pages == 256
    assert p.usable_tokens == 4 * 1024 - 16
    assert "256 pages of 16 tokens" in p.describe()


def test_shared_host_memory_takes_a_modest_share_of_available_ram():
    assert HOST.shared_with_host and HOST.default_share == 0.1
    p = plan(policy=HOST, mem_fraction=0.9)
    assert p.num_slots == int(10 * GIB * HOST.default_share) // (1 << 20) // 16 * 16
    # A small model is capped at a token count, not a memory share.
    small = plan(policy=HOST, bytes_per_slot=1024)
    assert small.num_slots == HOST.default_max_tokens + 16
    explicit = plan(policy=HOST, bytes_per_slot=1024, max_total_tokens=100_000)
    assert explicit.usable_tokens == 100_000  # an explicit size may exceed the default cap


def test_max_total_tokens_caps_and_rounds_to_pages():
    p = plan(max_total_tokens=1000)
    assert p.num_slots == 1024  # 63 pages hold 1000 tokens, plus page 0
    assert p.usable_tokens == 1008
    assert plan(max_total_tokens=1024).num_slots == 1024 + 16


def test_no_room_is_a_clear_error():
    with pytest.raises(MemoryError, match="raise --mem-fraction"):
        plan(free_bytes_now=5 * GIB)  # the weights took more than the fraction allowed
    with pytest.raises(MemoryError, match="--max-total-tokens"):
        plan(max_total_tokens=10_000)
    with pytest.raises(ValueError, match="mem-fraction"):
        plan(mem_fraction=1.5)
