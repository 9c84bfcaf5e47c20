"""A child that must not outlive the process that started it, however that process ends
(kill -9 included): Linux delivers SIGTERM to it when its parent thread exits. Elsewhere a
no-op; those children then rely on being stopped in order."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def end_with_parent(sig: int = signal.SIGTERM) -> None:
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the call: nobody would signal us
        os.kill(os.getpid(), sig)
