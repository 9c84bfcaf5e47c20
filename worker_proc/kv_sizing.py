"""How many KV token slots the arena gets (ARCHITECTURE.md: one allocation at start-up).

The plugin's `MemoryPolicy` (hal/platform.py) says which rule applies:
    device memory:       mem_fraction of the device's free memory *before the weights* is the
                         budget for weights + KV; the KV gets what the weights left of it.
    shared host memory:  a modest share of what is free (the policy's default_share, at most
                         --mem-fraction) and at most its default_max_tokens slots;
                         --max-total-tokens asks for more.
Either way --max-total-tokens caps it, and it never exceeds what max_running_requests full
contexts could use. The result is whole pages; page 0 is reserved for padding.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.codes import OUT_OF_MEMORY, coded
from tessera.hal.platform import MemoryPolicy


@dataclass(frozen=True)
class KVPlan:
    num_slots: int  # includes page 0 (reserved)
    page_size: int
    bytes_per_slot: int

    @property
    def num_pages(self) -> int:
        return self.num_slots // self.page_size

    @property
    def usable_tokens(self) -> int:
        return self.num_slots - self.page_size

    @property
    def total_bytes(self) -> int:
        return self.num_slots * self.bytes_per_slot

    def describe(self) -> str:
        return (f"KV cache: {self.num_pages} pages of {self.page_size} tokens "
                f"({self.usable_tokens} usable token slots, {self.total_bytes / 2**20:.1f} MiB)")


def plan_kv(*, free_bytes_now: int, free_bytes_before_weights: int, policy: MemoryPolicy,
            mem_fraction: float, max_total_tokens: int | None, page_size: int,
            bytes_per_slot: int, max_context_len: int, max_running_requests: int) -> KVPlan:
    if not 0.0 < mem_fraction <= 1.0:
        raise ValueError(f"--mem-fraction must be in (0, 1], got {mem_fraction}")
    if policy.shared_with_host:
        budget = free_bytes_now * min(mem_fraction, policy.default_share)
        if max_total_tokens is not None:
            budget = free_bytes_now * mem_fraction  # an explicit cap may use more
    else:
        budget = free_bytes_now - free_bytes_before_weights * (1.0 - mem_fraction)
    slots = int(budget // bytes_per_slot)
    if policy.default_max_tokens is not None and max_total_tokens is None:
        slots = min(slots, policy.default_max_tokens + page_size)
    if max_total_tokens is not None:
        # Whole pages holding at least max_total_tokens, plus the reserved page 0.
        wanted = -(-max_total_tokens // page_size) * page_size + page_size
        if slots < wanted:
            raise MemoryError(
                f"--max-total-tokens {max_total_tokens} needs "
                f"{wanted * bytes_per_slot / 2**20:.0f} MiB of KV cache but only "
                f"{max(budget, 0) / 2**20:.0f} MiB are available; lower it or raise "
                f"--mem-fraction" + coded(OUT_OF_MEMORY))
        slots = wanted
    # More than every row's full context could never be used.
    slots = min(slots, max_running_requests * max_context_len + page_size)
    slots = slots // page_size * page_size
    if slots < 2 * page_size:
        raise MemoryError(
            f"no memory left for the KV cache ({max(budget, 0) / 2**20:.0f} MiB for "
            f"{bytes_per_slot} bytes per token): raise --mem-fraction, use a smaller model or "
            f"dtype, or free device memory" + coded(OUT_OF_MEMORY))
    return KVPlan(num_slots=slots, page_size=page_size, bytes_per_slot=bytes_per_slot)
