"""Read-only attachment to the scheduler's shared-memory page table `req_to_token`."""

from __future__ import annotations

import logging
from multiprocessing import resource_tracker, shared_memory

import numpy as np

log = logging.getLogger(__name__)


class AttachedPageTable:
    """The scheduler creates (and unlinks) the block; a worker only maps it. Attached lazily,
    on the first ForwardBatch, because the scheduler creates it after the workers are ready."""

    def __init__(self, name: str, rows: int, width: int) -> None:
        self.name, self.rows, self.width = name, rows, width
        self._shm: shared_memory.SharedMemory | None = None
        self._array: np.ndarray | None = None

    @property
    def array(self) -> np.ndarray:
        if self._array is None:
            try:
                shm = shared_memory.SharedMemory(name=self.name)
            except FileNotFoundError:
                raise RuntimeError(f"shared page table {self.name} does not exist: the "
                                   f"scheduler creates it; is it running?") from None
            # Python < 3.13 registers attachments with the resource tracker, which would
            # unlink the scheduler's block when this worker exits.
            try:
                resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - best effort; only a warning at exit otherwise
                pass
            need = self.rows * self.width * 4
            if shm.size < need:
                shm.close()
                raise RuntimeError(f"shared page table {self.name} has {shm.size} bytes, "
                                   f"expected {need} ({self.rows} x {self.width} int32): the "
                                   f"scheduler and worker disagree on the configuration")
            self._shm = shm
            self._array = np.ndarray((self.rows, self.width), dtype=np.int32, buffer=shm.buf)
        return self._array

    def close(self) -> None:
        self._array = None
        if self._shm is not None:
            try:
                self._shm.close()
            except BufferError:
                log.debug("page table view still referenced at close")
            self._shm = None
