"""What the scheduler needs to know: the engine's batching flags plus the worker's arena."""

from __future__ import annotations

from dataclasses import dataclass

from tessera.bus.config import EngineConfig
from tessera.bus.messages import WorkerReady


@dataclass(frozen=True)
class SchedulerConfig:
    num_slots: int  # KV token slots of the arena (page 0 included)
    page_size: int
    max_context_len: int
    max_running_requests: int = 256
    chunked_prefill_size: int = 2048  # prefill tokens per step; 0: no limit
    max_queued_requests: int = 4096
    disable_radix_cache: bool = False
    schedule_policy: str = "fcfs"  # fcfs | priority (higher `priority` first, then FCFS)
    eos_token_ids: tuple[int, ...] = ()
    vocab_size: int = 0  # 0: unknown, ids not checked
    overlap: bool = True  # build step n+1 while step n runs (False: one step at a time)
    debug: bool = False  # check every invariant after every step (slow)

    def __post_init__(self) -> None:
        if self.schedule_policy not in ("fcfs", "priority"):
            raise ValueError(f"schedule_policy must be fcfs or priority, "
                             f"got {self.schedule_policy!r}")
        if self.max_running_requests < 1:
            raise ValueError("max_running_requests must be at least 1")

    @classmethod
    def from_engine(cls, config: EngineConfig, ready: WorkerReady, *, overlap: bool = True,
                    debug: bool = False) -> SchedulerConfig:
        if ready.page_size != config.page_size:
            raise ValueError(f"worker uses page_size {ready.page_size}, the engine was "
                             f"configured with {config.page_size}")
        return cls(
            num_slots=ready.num_slots,
            page_size=ready.page_size,
            max_context_len=ready.max_context_len,
            max_running_requests=config.max_running_requests,
            chunked_prefill_size=config.chunked_prefill_size,
            max_queued_requests=config.max_queued_requests,
            disable_radix_cache=config.disable_radix_cache,
            schedule_policy=config.schedule_policy,
            eos_token_ids=tuple(ready.eos_token_ids),
            vocab_size=ready.vocab_size,
            overlap=overlap,
            debug=debug,
        )
