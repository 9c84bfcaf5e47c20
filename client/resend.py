"""Requests a dead tokenizer may have lost, sent again once it is back.

A tokenizer that dies (kill -9, a crash) takes the requests still in its queue with it; those
it passed on to the scheduler run on. The client cannot tell which is which, so every request
sent to that tokenizer and not answered yet is sent again when the restarted tokenizer is
ready, marked `resent`: the scheduler ignores a copy of a request it already has. Aborts that
found the tokenizer gone wait for it too. Thread-safe: callers' threads send, the receiver
thread sees answers and the tokenizer's return.
"""

from __future__ import annotations

import dataclasses
import threading

from tessera.bus.messages import AbortRequest, GenerateRequest

_MAX_WAITING_ABORTS = 10_000


def tokenizer_index(name: str) -> int | None:
    """The index of a tokenizer process by its name ("tokenizer", "tokenizer3"), else None."""
    if not name.startswith("tokenizer"):
        return None
    suffix = name.removeprefix("tokenizer")
    return int(suffix) if suffix.isdigit() else 0 if not suffix else None


class Resender:
    def __init__(self) -> None:
        self._unanswered: dict[str, tuple[int, GenerateRequest]] = {}
        self._aborts: dict[int, list[AbortRequest]] = {}
        self.down: set[int] = set()
        self.resent_total = 0
        self._lock = threading.Lock()

    def sent(self, index: int, req: GenerateRequest) -> None:
        with self._lock:
            self._unanswered[req.rid] = (index, req)

    def answered(self, rid: str) -> None:
        """The request's first reply came: its tokenizer is done with it."""
        if rid in self._unanswered:  # a dict read is atomic; most replies are not the first
            with self._lock:
                self._unanswered.pop(rid, None)

    forget = answered

    def abort_failed(self, index: int, abort: AbortRequest) -> None:
        with self._lock:
            waiting = self._aborts.setdefault(index, [])
            if len(waiting) < _MAX_WAITING_ABORTS:
                waiting.append(abort)

    def tokenizer_down(self, index: int) -> bool:
        """Note the tokenizer's death; True the first time."""
        with self._lock:
            if index in self.down:
                return False
            self.down.add(index)
            return True

    def tokenizer_back(self, index: int) -> tuple[list[GenerateRequest], list[AbortRequest]]:
        """The requests to send again (marked resent) and the aborts that waited."""
        with self._lock:
            self.down.discard(index)
            again = [dataclasses.replace(req, resent=True)
                     for i, req in self._unanswered.values() if i == index]
            aborts = self._aborts.pop(index, [])
        self.resent_total += len(again)
        return again, aborts
