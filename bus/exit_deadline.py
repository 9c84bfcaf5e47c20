"""A last resort for processes that must stop on SIGTERM even when stuck: once a stop signal
arrives, the process ends `grace_s` later whatever its main thread is doing.

Python runs a signal handler only when the main thread comes back to the interpreter. A main
thread blocked inside a driver call (a device wait on a collective that a peer will never
join) never does, so the handler's "please stop" is never read and the supervisor has to
SIGKILL it. The C-level handler still writes the signal number to the wakeup fd at once:

    arm_exit_deadline(2.5)        # in the main thread, before the loop starts

starts a thread that waits on that fd and, `grace_s` after SIGTERM, SIGINT or SIGHUP, logs
that the orderly stop did not finish and ends the process (`os._exit`, exit code 3).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
EXIT_CODE = 3


def arm_exit_deadline(grace_s: float) -> None:
    """Must be called from the main thread (signal.set_wakeup_fd)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    threading.Thread(target=_watch, args=(read_fd, grace_s), name="exit-deadline",
                     daemon=True).start()


def _watch(read_fd: int, grace_s: float) -> None:
    stops = {int(s) for s in STOP_SIGNALS}
    while True:
        try:
            data = os.read(read_fd, 64)
        except OSError:
            return
        if not data:
            return
        if stops.intersection(data):
            break
    time.sleep(grace_s)
    message = (f"process {os.getpid()} did not finish stopping within {grace_s:g} s of the "
               f"stop signal: exiting now\n")
    try:
        os.write(2, message.encode())
    finally:
        os._exit(EXIT_CODE)
