"""`python -m tessera.scheduler_proc --run-dir DIR [--no-overlap] [--debug-invariants]`."""

from __future__ import annotations

import sys

from tessera.bus.process import process_main
from tessera.scheduler_proc.process import READY_TIMEOUT_S, STEP_TIMEOUT_S, SchedulerProcess

if __name__ == "__main__":
    sys.exit(process_main(SchedulerProcess, extra_args={
        "--ready-timeout-s": {"type": float, "default": READY_TIMEOUT_S,
                              "help": "wait this long for every worker rank's WorkerReady"},
        "--step-timeout-s": {"type": float, "default": STEP_TIMEOUT_S,
                             "help": "a worker step unanswered this long fails its requests"},
        "--no-overlap": {"action": "store_true",
                         "help": "send one step at a time (debugging)"},
        "--debug-invariants": {"action": "store_true",
                               "help": "check the page invariant after every step (slow)"},
    }))
