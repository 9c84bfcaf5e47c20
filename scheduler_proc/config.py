"""What the scheduler needs to know: the engine's batching flags plus the worker's arena."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tessera.bus.messages import WorkerReady
from tessera.config import BatchingConfig, EngineConfig, steps_in_flight


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig(BatchingConfig):
    num_slots: int  # KV token slots of the arena (page 0 included)
    max_context_len: int
    eos_token_ids: tuple[int, ...] = ()
    vocab_size: int = 0  # 0: unknown, ids not checked
    # 0: overlap as configured (a step may refer to the token of the one before it, still in
    # flight). N > 0: the workers hold N batches in flight (pipeline stages) and none may
    # depend on another in flight: a row decodes again only once its token is back.
    batches_in_flight: int = 0
    # The sizes a step that prefills runs padded to (WorkerReady.step_token_sizes); with
    # fill_padded_steps its prefill budget grows into the padding.
    step_token_sizes: tuple[int, ...] = ()

    @property
    def steps_in_flight(self) -> int:
        """Steps sent and not answered, at most: --overlap-steps with overlap, or as many as
        the workers hold (pipeline stages); one without overlap."""
        return steps_in_flight(self.overlap, self.overlap_steps, self.batches_in_flight)

    @property
    def chained(self) -> bool:
        """Whether a step may refer to the token of the step before it, still in flight
        (otherwise a row decodes again only once its token is back)."""
        return self.batches_in_flight == 0

    @classmethod
    def from_engine(cls, config: EngineConfig, ready: WorkerReady) -> SchedulerConfig:
        if ready.page_size != config.page_size:
            raise ValueError(f"worker uses page_size {ready.page_size}, the engine was "
                             f"configured with {config.page_size}")
        batching = {f.name: getattr(config, f.name) for f in dataclasses.fields(BatchingConfig)}
        if not config.overlap_steps:  # auto: as the workers resolved it (0 if unsaid: 2)
            batching["overlap_steps"] = ready.overlap_steps
        return cls(
            **batching,
            num_slots=ready.num_slots,
            max_context_len=ready.max_context_len,
            eos_token_ids=tuple(ready.eos_token_ids),
            vocab_size=ready.vocab_size,
            batches_in_flight=ready.batches_in_flight,
            step_token_sizes=tuple(sorted(ready.step_token_sizes)),
        )
