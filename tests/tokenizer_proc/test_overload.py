"""A scheduler that does not take requests: clients get 503 at once, then the breaker opens."""

from __future__ import annotations

from tessera.bus.channel import SendTimeout
from tessera.bus.messages import AbortRequest, ErrorReply, GenerateRequest, TokenizedRequest
from tessera.bus.run_paths import RunPaths
from tessera.config import EngineConfig
from tessera.tokenizer_proc.process import TokenizerProcess


class FakeScheduler:
    def __init__(self) -> None:
        self.down = True
        self.got: list[object] = []

    def send(self, msg: object) -> None:
        if self.down:
            raise SendTimeout("scheduler")
        self.got.append(msg)


class FakeReplies:
    def __init__(self) -> None:
        self.sent: list[tuple[str, object]] = []

    def send(self, endpoint: str, msg: object) -> None:
        self.sent.append((endpoint, msg))


def make(tokenizer, tmp_path) -> TokenizerProcess:
    proc = TokenizerProcess(RunPaths(str(tmp_path)),
                            EngineConfig(breaker_failures=2, breaker_cooldown_s=60.0), index=1)
    proc.tokenizer, proc.context_length = tokenizer, 8192
    proc.scheduler, proc.replies = FakeScheduler(), FakeReplies()  # type: ignore[assignment]
    return proc


def test_timeouts_give_503_then_the_breaker_fails_fast(tokenizer, tmp_path):
    proc = make(tokenizer, tmp_path)
    assert proc.name == "tokenizer1"
    reqs = [GenerateRequest(rid=f"r{i}", reply_to="ipc://c", prompt="hi") for i in range(3)]
    proc.handle(reqs)
    errors = [m for _, m in proc.replies.sent]
    assert [e.status for e in errors] == [503, 503, 503]
    assert all(isinstance(e, ErrorReply) and e.error_type == "server_error" for e in errors)
    assert "did not take the request in time" in errors[0].message
    assert "unavailable or overloaded" in errors[2].message  # breaker open: not even tried
    assert proc.stats()["unavailable"] == 3.0


def test_healthy_scheduler_gets_requests_and_aborts(tokenizer, tmp_path):
    proc = make(tokenizer, tmp_path)
    proc.scheduler.down = False
    proc.handle([GenerateRequest(rid="a", reply_to="ipc://c", prompt="hi"),
                 AbortRequest(rid="a")])
    kinds = [type(m) for m in proc.scheduler.got]
    assert kinds == [TokenizedRequest, AbortRequest] and proc.replies.sent == []


def test_request_without_reply_to_is_dropped_and_bad_rid_answered(tokenizer, tmp_path):
    proc = make(tokenizer, tmp_path)
    proc.scheduler.down = False
    proc.handle([GenerateRequest(rid="x", reply_to="", prompt="hi"),
                 GenerateRequest(rid="", reply_to="ipc://c", prompt="hi")])
    assert proc.scheduler.got == []
    [(_, err)] = proc.replies.sent
    assert err.status == 400 and err.param == "rid"
