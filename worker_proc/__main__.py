"""`python -m tessera.worker_proc --run-dir DIR --rank R`."""

from __future__ import annotations

import logging
import os
import sys
import traceback

from tessera.bus.exit_deadline import arm_exit_deadline
from tessera.bus.process import process_main
from tessera.worker_proc.process import WorkerProcess

# The supervisor kills a child 3 s after SIGTERM: a worker stuck on a peer ends itself first.
STOP_DEADLINE_S = 2.5


def main() -> int:
    try:
        return process_main(WorkerProcess, extra_args={
            "--rank": {"type": int, "default": 0,
                       "help": "worker rank: pipeline stage * --tp-size + tensor-parallel rank"},
        })
    except SystemExit as exc:  # argparse
        return exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - said on stderr, where the supervisor quotes it
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    arm_exit_deadline(STOP_DEADLINE_S)
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's teardown: the communicators are left and the sockets closed;
    # what remains (device memory, captured graphs, process groups) the driver reclaims at
    # exit, without the destructors that can wait on peers that are gone.
    os._exit(code)
