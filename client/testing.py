"""A fake engine for testing clients and the HTTP server without a model.

`FakeEngine(paths)` binds the tokenizer and supervisor endpoints of a run directory and
behaves like the real pipeline seen from outside: it answers each GenerateRequest with one
RequestOutput per token and choice (or one final output when `stream=False`), honours
`max_tokens`, `n`, `logprobs`, `ignore_eos` and aborts, and answers StatusRequests like the
supervisor. Its "model" says `w0 w1 w2 ...` (choice i > 0 says `w0.i w1.i ...`) and stops
after `reply_len` tokens; `ignore_eos` without `max_tokens` runs, as the real engine's
requests do, until the prompt and the output fill `context_len` (finish reason "length").
Magic words in the prompt make it misbehave:

    FAIL_400 / FAIL_413 / FAIL_503   answer with an ErrorReply of that status
    HANG                             accept the request and never answer

`kill(name)` marks a process dead in the status (and stops all output, as a dead engine
would); `crash(name)` / `revive(name)` mark it dead then up again (a restart) without stopping
output; with `drop_requests` set, requests are received and never run (a tokenizer that dies
with them in its queue); `silence_supervisor()` stops status answers.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tessera.bus.channel import Inbox, OutboxPool, SendTimeout
from tessera.bus.messages import (
    AbortRequest,
    ErrorReply,
    GenerateRequest,
    Heartbeat,
    Message,
    Ready,
    RequestOutput,
    StatusReply,
    StatusRequest,
)
from tessera.bus.run_paths import RunPaths

ERRORS: dict[str, tuple[int, str, str]] = {
    "FAIL_400": (400, "the prompt is not acceptable (fake engine)", "invalid_request_error"),
    "FAIL_413": (413, "the prompt has 5000 tokens but the model's context is 2048; shorten "
                 "it", "invalid_request_error"),
    "FAIL_503": (503, "the scheduler queue is full; retry later", "overloaded_error"),
}
ENGINE_PROCESSES = ("tokenizer", "scheduler", "worker0", "detokenizer")


@dataclass
class _Choice:
    req: GenerateRequest
    index: int
    emitted: int = 0
    text: str = ""
    ids: list[int] = field(default_factory=list)
    room: int = 0  # tokens the context leaves after the prompt


def token_text(k: int, index: int) -> str:
    word = f"w{k}" if index == 0 else f"w{k}.{index}"
    return word if k == 0 else " " + word


def prompt_text(req: GenerateRequest) -> str:
    if req.prompt is not None:
        return req.prompt
    if req.messages is not None:
        return " ".join(str(m.get("content", "")) for m in req.messages)
    return ""


class FakeEngine:
    def __init__(self, paths: RunPaths, *, token_delay_s: float = 0.002, reply_len: int = 8,
                 context_len: int = 32768,
                 process_names: tuple[str, ...] = ENGINE_PROCESSES) -> None:
        self.paths = paths
        self.token_delay_s = token_delay_s
        self.reply_len = reply_len
        self.context_len = context_len
        self.requests: list[GenerateRequest] = []
        self.aborts: list[AbortRequest] = []
        self.emitted_at_abort: dict[str, int] = {}  # rid -> tokens it had produced, all choices
        self.control: list[Message] = []  # Ready / Heartbeat messages received
        self.startup: dict[str, Any] = {}  # the supervisor's start-up report, when set
        self.processes: dict[str, dict[str, Any]] = {
            name: {"alive": True, "pid": os.getpid(), "age_s": 0.0,
                   "stats": {"running": 0.0}} for name in process_names}
        self.supervisor_silent = False
        self.frozen = False
        self.drop_requests = False
        self._active: list[_Choice] = []
        self._replies = OutboxPool(timeout_ms=200)
        self._stop = threading.Event()
        self._tokenizer = Inbox(paths.tokenizer, name="fake-tokenizer")
        self._supervisor = Inbox(paths.supervisor, name="fake-supervisor")
        self._thread = threading.Thread(target=self._run, name="fake-engine", daemon=True)
        self._thread.start()

    # -- controls ---------------------------------------------------------------------------
    def kill(self, name: str) -> None:
        """Report `name` dead; every process stops producing output."""
        self.processes[name]["alive"] = False
        self.frozen = True

    def crash(self, name: str) -> None:
        """Report `name` dead (its restart is under way); output goes on."""
        self.processes[name]["alive"] = False

    def revive(self, name: str) -> None:
        """Report `name` up again (restarted)."""
        self.processes[name]["alive"] = True

    def silence_supervisor(self) -> None:
        self.supervisor_silent = True

    @property
    def in_flight(self) -> int:
        return len(self._active)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
        self._tokenizer.close()
        self._supervisor.close()
        self._replies.close()

    def __enter__(self) -> FakeEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- loop -------------------------------------------------------------------------------
    def _run(self) -> None:
        # A step is due token_delay_s after the previous one was sent. Arrivals wake the
        # drain early; they are taken in and the wait goes on to the same deadline, so a
        # request's consecutive tokens are never closer than token_delay_s.
        step_due = time.monotonic() + self.token_delay_s
        while not self._stop.is_set():
            for msg in self._tokenizer.drain(max(0.0, step_due - time.monotonic())):
                if isinstance(msg, GenerateRequest):
                    self._start(msg)
                elif isinstance(msg, AbortRequest):
                    self._abort(msg)
            for msg in self._supervisor.drain(0.0):
                if isinstance(msg, StatusRequest):
                    self._status(msg)
                elif isinstance(msg, Ready | Heartbeat):
                    self.control.append(msg)
            if time.monotonic() < step_due:
                continue
            if not self.frozen:
                self._step()
            step_due = time.monotonic() + self.token_delay_s

    def _send(self, endpoint: str, msg: Message) -> None:
        try:
            self._replies.send(endpoint, msg)
        except SendTimeout:  # the client is gone: what a real detokenizer does too
            pass

    def _start(self, req: GenerateRequest) -> None:
        # Recorded in `requests` once its choices are in flight (a test that sees the request
        # sees them in in_flight too), before any reply to it.
        if self.drop_requests:
            self.requests.append(req)
            return
        if req.resent and any(c.req.rid == req.rid for c in self._active):
            self.requests.append(req)
            return  # the first copy got through: as the scheduler does
        text = prompt_text(req)
        for word, (status, message, kind) in ERRORS.items():
            if word in text:
                self.requests.append(req)
                self._send(req.reply_to, ErrorReply(rid=req.rid, status=status,
                                                    message=message, error_type=kind))
                return
        if "HANG" not in text:
            room = self.context_len - self._prompt_tokens(req)
            self._active.extend(_Choice(req, i, room=room) for i in range(req.sampling.n))
        self.requests.append(req)

    def _abort(self, msg: AbortRequest) -> None:
        # The choices leave _active before the abort is recorded: a test that sees the abort
        # in `aborts` (from its own thread) sees in_flight without them (CI, stop 41, read
        # 15 of 16 choices still in flight between the two).
        aborted = [c for c in self._active if c.req.rid == msg.rid]
        for choice in aborted:
            self._active.remove(choice)
        if aborted:
            self.emitted_at_abort[msg.rid] = sum(c.emitted for c in aborted)
        self.aborts.append(msg)
        for choice in aborted:
            self._send(choice.req.reply_to, self._output(choice, [], "abort"))

    def _status(self, msg: StatusRequest) -> None:
        if self.supervisor_silent:
            return
        for info in self.processes.values():
            info["stats"] = {**info.get("stats", {}), "running": float(len(self._active))}
        reply = StatusReply(nonce=msg.nonce, processes={k: dict(v) for k, v in
                                                        self.processes.items()}, ready=True,
                            startup=dict(self.startup))
        self._send(msg.reply_to, reply)

    def _prompt_tokens(self, req: GenerateRequest) -> int:
        if req.input_ids is not None:
            return int(req.input_ids.shape[0])
        return max(1, len(prompt_text(req).split()))

    def _output(self, c: _Choice, new: list[int], finish: str | None) -> RequestOutput:
        req = c.req
        first = c.emitted - len(new)
        texts = [token_text(first + j, c.index) for j in range(len(new))]
        extra: dict[str, Any] = {}
        k = req.sampling.logprobs
        if k is not None and new:
            lps = np.array([-0.25 * ((first + j) % 4) for j in range(len(new))], np.float32)
            width = max(k, 1)
            top_ids = np.array([[t + a for a in range(width)] for t in new], np.int32)
            top_lps = np.array([[lp - a for a in range(width)] for lp in lps], np.float32)
            top_texts = [[texts[j] if a == 0 else f"alt{a}" for a in range(width)]
                         for j in range(len(new))]
            if k == 0:
                top_ids, top_lps, top_texts = top_ids[:, :0], top_lps[:, :0], [[]] * len(new)
            extra = dict(logprobs=lps, top_ids=top_ids, top_logprobs=top_lps,
                         token_texts=texts, top_token_texts=top_texts)
        return RequestOutput(
            rid=req.rid, index=c.index, text="".join(texts),
            token_ids=np.array(new, np.int32), finish_reason=finish,
            prompt_tokens=self._prompt_tokens(req), completion_tokens=c.emitted, **extra)

    def _step(self) -> None:
        for c in list(self._active):
            sp = c.req.sampling
            c.ids.append(100 + c.emitted)
            c.emitted += 1
            finish = None
            if sp.max_tokens is not None and c.emitted >= sp.max_tokens or c.emitted >= c.room:
                finish = "length"
            elif c.emitted >= self.reply_len and not sp.ignore_eos:
                finish = "stop"
            if finish is not None:
                self._active.remove(c)
            if c.req.stream:
                self._send(c.req.reply_to, self._output(c, c.ids[-1:], finish))
            elif finish is not None:
                self._send(c.req.reply_to, self._output(c, c.ids, finish))
