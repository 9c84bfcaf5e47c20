"""`python -m tessera.worker_proc --run-dir DIR --rank R`."""

from __future__ import annotations

import sys

from tessera.bus.process import process_main
from tessera.worker_proc.process import WorkerProcess

if __name__ == "__main__":
    sys.exit(process_main(WorkerProcess, extra_args={
        "--rank": {"type": int, "default": 0, "help": "tensor-parallel rank of this worker"},
    }))
