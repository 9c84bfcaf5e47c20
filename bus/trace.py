"""Message timestamps across the engine's processes, for finding where a request's time goes.

With `--trace-messages-dir DIR` every engine process (and the offline `LLM`'s client) appends
one JSON line per message it sends, receives (its inbox thread decoded it) and takes (its loop
drained it), and the worker one per phase of a step (launch begun and done, the device's
output seen ready), to DIR/<process>-<pid>.jsonl:

    {"t": wall-clock ns, "p": process, "e": send | recv | take | launch | launched | ready,
     "c": channel, "m": message type, "rid": ..., "rids": [...], "step": ...}

The clock is CLOCK_REALTIME, the same for every process of a host, so lines of several files
order into one timeline; `python -m tessera.benchmarks.message_trace DIR` lines them up into
each request's path to its first token, hop by hop. Off unless started: then every hook is one
test of a module attribute. A line is flushed as it is written (a trace survives a crash), at a
few microseconds a message: a diagnostic, not for production.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, TextIO

import msgpack
import numpy as np

_out: TextIO | None = None
_process = ""
# Message fields worth a line: who a message is for and which step it belongs to.
_FIELDS = ("rid", "rids", "step")


def start(directory: str | None, process: str) -> None:
    """Trace this process's messages into `directory` (None: leave tracing off)."""
    global _out, _process
    if not directory:
        return
    os.makedirs(directory, exist_ok=True)
    stop()
    _process = process
    _out = open(os.path.join(directory, f"{process}-{os.getpid()}.jsonl"), "a", buffering=1)


def stop() -> None:
    global _out
    if _out is not None:
        _out.close()
        _out = None


def active() -> bool:
    return _out is not None


def now() -> int:
    return time.time_ns()


def note(event: str, channel: str, kind: str = "", at: int = 0, **fields: Any) -> None:
    """One line: `event` on `channel` of a `kind` of message, at `at` ns (0: now)."""
    out = _out
    if out is None:
        return
    line = {"t": at or time.time_ns(), "p": _process, "e": event, "c": channel, "m": kind}
    line.update(fields)
    # A field of a malformed message may be anything a peer sent (bytes, maps): written as
    # its repr; a trace line must never fail the receive or send it describes.
    try:
        text = json.dumps(line, separators=(",", ":"), default=repr)
    except (TypeError, ValueError):  # a map with keys JSON cannot hold, a cycle
        text = json.dumps({k: line[k] for k in ("t", "p", "e", "c", "m")})
    out.write(text + "\n")


def note_launch(channel: str, batch: Any) -> None:
    """A worker's launch of a ForwardBatch, with what step_trace reads of it: the step's
    tokens, requests, decodes (rows of one token) and their context (their seq_lens)."""
    if _out is None:
        return
    extend = np.asarray(batch.extend_lens)
    decode = extend == 1
    note("launch", channel, "ForwardBatch", step=batch.step, tokens=int(extend.sum()),
         requests=int(extend.shape[0]), decodes=int(decode.sum()),
         context=int(np.asarray(batch.seq_lens)[decode].sum()))


def note_message(event: str, channel: str, msg: Any) -> None:
    if _out is None:
        return
    fields = {k: getattr(msg, k) for k in _FIELDS if hasattr(msg, k)}
    note(event, channel, type(msg).__name__, **fields)


def note_frames(event: str, channel: str, frames: list[Any], at: int = 0) -> None:
    """A message already encoded (bus/codec.py): its type and fields from the header frame.
    A send is noted once it succeeded, at the time it began (`at`): its receiver may note
    the message before the sender's line is written."""
    if _out is None:
        return
    head = frames[0]
    raw = head.bytes if hasattr(head, "bytes") else bytes(head)
    try:
        header = msgpack.unpackb(raw, raw=False)
        plain = header.get("f", {})
        fields = {k: plain[k] for k in _FIELDS if k in plain}
        note(event, channel, str(header.get("t", "")), at, **fields)
    except Exception:  # noqa: BLE001 - a trace line must never fail a send
        note(event, channel, "?", at)


def channel_name(endpoint: str) -> str:
    """An endpoint as a trace names it: its socket file's name, or the address."""
    return os.path.basename(endpoint) if endpoint.startswith("ipc://") else endpoint
