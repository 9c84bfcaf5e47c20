"""`python -m tessera.scheduler_proc --run-dir DIR` (its settings come from the run's config)."""

from __future__ import annotations

import sys

from tessera.bus.process import process_main
from tessera.scheduler_proc.process import SchedulerProcess

if __name__ == "__main__":
    sys.exit(process_main(SchedulerProcess))
