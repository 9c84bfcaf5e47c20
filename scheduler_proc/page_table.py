"""The shared-memory page table `req_to_token` and its rows.

int32 [max_running_requests, max_context_len]: row r, column i holds the KV slot of token i of
the request bound to row r. The scheduler creates it (under `RunPaths.shm_req_to_token`) and is
the only writer; workers attach by name and read the rows a ForwardBatch names. The scheduler
unlinks it at teardown.

A row may be rewritten only while no step in flight reads it: the scheduler releases a row
(`RowPool.free`) only after every step that named it has come back.
"""

from __future__ import annotations

import logging
from multiprocessing import shared_memory

import numpy as np

log = logging.getLogger(__name__)


class SharedPageTable:
    """Owns the shared-memory block; `array` is the numpy view the scheduler writes."""

    def __init__(self, name: str, rows: int, width: int) -> None:
        size = max(rows * width * 4, 4)
        try:
            self._shm = shared_memory.SharedMemory(name=name, create=True, size=size)
        except FileExistsError:
            # Left behind by a crashed run with the same id: nobody can be using it.
            log.warning("removing a stale shared page table %s", name)
            stale = shared_memory.SharedMemory(name=name)
            stale.close()
            stale.unlink()
            self._shm = shared_memory.SharedMemory(name=name, create=True, size=size)
        self.name = name
        # A new segment reads as zeros and its memory is committed only where written, so a
        # long context costs only the rows in use: do not clear it by hand.
        self.array: np.ndarray = np.ndarray((rows, width), dtype=np.int32, buffer=self._shm.buf)

    def close(self) -> None:
        """Release and unlink (idempotent)."""
        if self._shm is None:
            return
        del self.array
        try:
            self._shm.close()
            self._shm.unlink()
        except FileNotFoundError:
            pass
        self._shm = None  # type: ignore[assignment]


class RowPool:
    """Free list of page-table rows (one per running sequence)."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self._free = list(range(rows - 1, -1, -1))

    @property
    def free_rows(self) -> int:
        return len(self._free)

    def alloc(self) -> int:
        return self._free.pop()

    def free(self, row: int) -> None:
        self._free.append(row)
