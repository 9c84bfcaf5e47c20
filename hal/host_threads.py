"""How a worker's host-side ops share the machine's cores with the engine's other processes.

Two settings, both measured on a 2-core machine serving SmolLM2-135M with the cpu plugin
(`docs/performance.md`, "the CPU step"):

- OpenMP's wait policy. By default an intra-op thread that reaches the end of a parallel
  region spins, holding its core, until the others arrive. The engine's scheduler,
  detokenizer and client share those cores, and so may anything else on the machine; when one
  of them preempts an intra-op thread, its partner spins through whole time slices at every
  one of the ~400 parallel regions of a step. A batch-32 decode step then cost 0.7-1.9 s of
  CPU instead of 0.16 s. With `OMP_WAIT_POLICY=PASSIVE` waiting threads sleep; a quiet machine
  loses a few microseconds of wake-up per region. The OpenMP runtime reads the variable once,
  when torch loads it, so `set_wait_policy` must run before torch is imported; a value the
  user set is kept.
- The number of intra-op threads (`--intra-op-threads`; 0: the cores this process may run on,
  divided among the worker ranks of the host, so that tensor-parallel ranks on one CPU do not
  oversubscribe it).

This module imports torch only inside `apply_thread_count`.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from tessera.config import usable_cores

WAIT_POLICY_VAR = "OMP_WAIT_POLICY"
WAIT_POLICY = "PASSIVE"


def set_wait_policy(environ: MutableMapping[str, str] | None = None) -> str:
    """Make idle OpenMP threads sleep instead of spin, unless the environment already says
    otherwise; returns the policy in force. Call before torch is imported."""
    env = os.environ if environ is None else environ
    return env.setdefault(WAIT_POLICY_VAR, WAIT_POLICY)


def thread_count(requested: int, ranks_on_host: int, cores: int) -> int:
    """Intra-op threads of one worker rank: `requested` when set, else its share of the
    cores (at least one)."""
    if requested < 0:
        raise ValueError(f"--intra-op-threads must be 0 (automatic) or positive, got "
                         f"{requested}")
    if requested:
        return requested
    return max(1, cores // max(1, ranks_on_host))


def apply_thread_count(requested: int, ranks_on_host: int) -> int:
    """Set torch's intra-op thread count for this process; returns it."""
    import torch

    threads = thread_count(requested, ranks_on_host, usable_cores())
    torch.set_num_threads(threads)
    return threads
