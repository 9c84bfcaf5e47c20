"""Errors, timeouts, the circuit breaker, aborts and the liveness watch of the client."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tessera.bus.run_paths import RunPaths
from tessera.client import (
    Client,
    EngineDeadError,
    OverloadedError,
    PromptTooLongError,
    RequestTimeoutError,
    TesseraError,
)
from tessera.client.errors import BadRequestError
from tessera.client.testing import FakeEngine
from tessera.config import EngineConfig


def wait_for(predicate, timeout: float = 2.0) -> bool:  # noqa: ANN001
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


@pytest.mark.parametrize("word, cls, status", [
    ("FAIL_400", BadRequestError, 400),
    ("FAIL_413", PromptTooLongError, 413),
    ("FAIL_503", OverloadedError, 503),
])
def test_engine_errors_become_typed_exceptions(client: Client, word: str,
                                               cls: type[TesseraError], status: int) -> None:
    with pytest.raises(cls) as info:
        client.generate(f"please {word}")
    assert info.value.status == status
    assert info.value.message  # the engine's own words reach the caller
    if status == 503:
        assert info.value.retry_after is not None and info.value.retry_after > 0
    # An engine that answers (even with an error) is healthy: the next request works.
    assert client.generate("hi", max_tokens=2).text == "w0 w1"


def test_leaving_a_stream_early_aborts_the_request(client: Client, engine: FakeEngine) -> None:
    stream = client.generate("hi", stream=True, max_tokens=1000, ignore_eos=True)
    assert next(stream).text == "w0"
    stream.close()
    assert wait_for(lambda: any(a.rid == stream.rid for a in engine.aborts))
    assert wait_for(lambda: engine.in_flight == 0)


def test_no_output_times_out_aborts_and_counts_against_the_breaker(
        paths: RunPaths, engine: FakeEngine) -> None:
    config = EngineConfig(breaker_failures=2, breaker_cooldown_s=0.4)
    with Client(paths, config, first_output_timeout_s=0.2) as client:
        for _ in range(2):
            started = time.monotonic()
            with pytest.raises(RequestTimeoutError) as info:
                client.generate("HANG")
            assert info.value.status == 504
            assert 0.15 < time.monotonic() - started < 1.5
        assert wait_for(lambda: len(engine.aborts) == 2)
        # Two timeouts in a row opened the breaker: the next request fails at once.
        sent = len(engine.requests)
        started = time.monotonic()
        with pytest.raises(OverloadedError) as info:
            client.generate("hi", max_tokens=1)
        assert time.monotonic() - started < 0.1
        assert info.value.status == 503 and info.value.retry_after >= 1.0
        assert len(engine.requests) == sent
        # After the cool-down one trial goes through; its success closes the breaker.
        time.sleep(0.45)
        assert client.generate("hi", max_tokens=1).text == "w0"
        assert client.generate("hi", max_tokens=1).text == "w0"


def test_inter_output_timeout(paths: RunPaths, engine: FakeEngine) -> None:
    with Client(paths, request_timeout_s=0.3) as client:
        stream = client.generate("hi", stream=True, max_tokens=1000, ignore_eos=True)
        assert next(stream).text == "w0"
        engine.frozen = True  # the engine stops producing mid-stream
        with pytest.raises(RequestTimeoutError, match="further output"):
            for _ in stream:
                pass


def test_dead_process_fails_streams_fast_and_new_requests_at_once(
        client: Client, engine: FakeEngine) -> None:
    client.status()  # the watch has seen every process alive
    stream = client.generate("hi", stream=True, max_tokens=10_000, ignore_eos=True)
    next(stream)
    killed = time.monotonic()
    engine.kill("scheduler")
    with pytest.raises(EngineDeadError, match="scheduler"):
        for _ in stream:
            pass
    assert time.monotonic() - killed < 2.0
    with pytest.raises(EngineDeadError) as info:
        client.generate("hi")
    assert info.value.status == 503


def test_silent_supervisor_counts_as_dead(client: Client, engine: FakeEngine) -> None:
    client.status()
    stream = client.generate("HANG", stream=True)
    engine.silence_supervisor()
    started = time.monotonic()
    with pytest.raises(EngineDeadError, match="supervisor"):
        next(stream)
    # heartbeat_timeout_s is 1 s in the test config
    assert time.monotonic() - started < 2.5


def test_a_supervisor_that_never_answers_fails_waiting_requests(
        paths: RunPaths, config: EngineConfig, engine: FakeEngine) -> None:
    """An engine that takes requests but never answers a status (one of another protocol
    version drops every message it cannot decode): requests in flight fail after the
    silence timeout instead of waiting forever, new ones are refused at once, and the first
    status that comes back lets requests through again."""
    engine.silence_supervisor()
    with Client(paths, config) as client:
        stream = client.generate("HANG", stream=True)
        started = time.monotonic()
        with pytest.raises(EngineDeadError, match="protocol") as info:
            next(stream)
        # heartbeat_timeout_s is 1 s in the test config, the status polls 0.1 s apart
        assert 0.9 < time.monotonic() - started < 2.5
        assert info.value.status == 503
        with pytest.raises(EngineDeadError):
            client.generate("hi", max_tokens=1)
        engine.supervisor_silent = False
        assert wait_for(lambda: client.conn.dead_reason is None, timeout=3.0)
        assert client.generate("hi", max_tokens=2).text == "w0 w1"


def test_duplicate_rid_is_refused(client: Client) -> None:
    stream = client.generate("HANG", stream=True, rid="same")
    with pytest.raises(BadRequestError, match="already in flight") as info:
        client.generate("hi", rid="same")
    assert info.value.status == 400 and info.value.param == "rid"
    stream.close()


def test_vanished_engine_pid_fails_streams_before_the_supervisor_says_so(
        client: Client, engine: FakeEngine) -> None:
    """The supervisor reaps a crashed child and stops everyone at once: the client checks
    the pids itself so a stream still ends with an error, not a cut connection."""
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        engine.processes["worker0"]["pid"] = victim.pid
        client.status()
        assert wait_for(lambda: victim.pid in client.conn._pids.values())
        stream = client.generate("hi", stream=True, max_tokens=10_000, ignore_eos=True)
        next(stream)
        victim.kill()
        victim.wait()  # reaped, as the supervisor does
        killed = time.monotonic()
        with pytest.raises(EngineDeadError, match="worker0"):
            for _ in stream:
                pass
        assert time.monotonic() - killed < 0.5
        # The (stale) status still says "alive": the dead pid stays dead.
        time.sleep(0.3)
        with pytest.raises(EngineDeadError):
            client.generate("hi")
    finally:
        victim.kill()
        victim.wait()


def test_no_engine_running_fails_fast_with_503(paths: RunPaths) -> None:
    config = EngineConfig(send_timeout_ms=200, breaker_failures=1, breaker_cooldown_s=5.0)
    with Client(paths, config) as client:
        started = time.monotonic()
        with pytest.raises(OverloadedError, match="not running") as info:
            client.generate("hi")
        assert info.value.status == 503
        assert time.monotonic() - started < 1.5
        # That send timeout opened the breaker (breaker_failures=1): refused at once now.
        started = time.monotonic()
        with pytest.raises(OverloadedError, match="retry in"):
            client.generate("hi")
        assert time.monotonic() - started < 0.1


@pytest.mark.parametrize("kwargs, cls, param", [
    ({"prompt": "x" * (17 << 20)}, PromptTooLongError, None),
    ({"prompt": "bad \ud800 text"}, BadRequestError, None),
    ({"messages": [{"role": "user", "content": "hi", "name": "\udfff"}]}, BadRequestError,
     None),
    ({"prompt": "hi", "rid": "r" * 300}, BadRequestError, "rid"),
    ({"prompt": "hi", "rid": "\ud800"}, BadRequestError, "rid"),
    ({"prompt": "hi", "stop_token_ids": [2**70]}, BadRequestError, "stop_token_ids"),
    ({"prompt": "hi", "stop": ["s" * 1500]}, BadRequestError, "stop"),
])
def test_requests_the_bus_cannot_carry_fail_at_once(client: Client, engine: FakeEngine,
                                                    kwargs: dict, cls: type[TesseraError],
                                                    param: str | None) -> None:
    t0 = time.monotonic()
    with pytest.raises(cls) as info:
        client.generate(**kwargs)
    assert time.monotonic() - t0 < 2.0  # not left waiting for the request timeout
    assert info.value.param == param
    assert not engine.requests  # nothing was sent
    assert client.generate("hi", max_tokens=2).text == "w0 w1"


def test_a_stream_left_unread_is_aborted_not_buffered(paths: RunPaths,
                                                      engine: FakeEngine) -> None:
    from tessera.client import SlowConsumerError

    config = EngineConfig(request_timeout_s=5.0, stream_buffer_outputs=50)
    with Client(paths, config) as client:
        stream = client.generate("hi", stream=True, max_tokens=100_000, ignore_eos=True)
        assert wait_for(lambda: any(a.rid == stream.rid for a in engine.aborts), 10.0)
        with pytest.raises(SlowConsumerError, match="50 outputs unread"):
            next(stream)
        assert client.generate("hi", max_tokens=2).text == "w0 w1"


def test_requests_a_dead_tokenizer_lost_are_sent_again_when_it_is_back(
        paths: RunPaths, config: EngineConfig, engine: FakeEngine) -> None:
    engine.drop_requests = True  # the tokenizer takes the request to its grave
    with Client(paths, config) as client:
        stream = client.generate("hi", stream=True, max_tokens=3)
        assert wait_for(lambda: any(r.rid == stream.rid for r in engine.requests))
        engine.crash("tokenizer")
        time.sleep(3 * config.heartbeat_interval_s)  # the client has seen it down
        engine.drop_requests = False
        engine.revive("tokenizer")  # restarted by the supervisor
        assert "".join(d.text for d in stream) == "w0 w1 w2"
        copies = [r for r in engine.requests if r.rid == stream.rid]
        assert [r.resent for r in copies] == [False, True]
        # Requests answered before the death are not sent twice; new ones go through.
        assert client.generate("again", max_tokens=2).text == "w0 w1"


def test_a_restarted_engine_process_fails_requests_in_flight_then_serves_again(
        paths: RunPaths, config: EngineConfig, engine: FakeEngine) -> None:
    with Client(paths, config) as client:
        stream = client.generate("hi", stream=True, max_tokens=1000, ignore_eos=True)
        assert next(stream).text == "w0"
        engine.crash("scheduler")
        with pytest.raises(EngineDeadError, match="scheduler is down"):
            for _ in stream:
                pass
        with pytest.raises(EngineDeadError):  # new requests fail fast while it restarts
            client.generate("hi", max_tokens=2)
        engine.revive("scheduler")
        assert wait_for(lambda: client.conn.dead_reason is None, 5.0)
        assert client.generate("hi", max_tokens=2).text == "w0 w1"


def test_the_http_server_is_not_on_a_bus_clients_path(paths: RunPaths, config: EngineConfig,
                                                      engine: FakeEngine) -> None:
    engine.processes["server"] = {"alive": True, "pid": os.getpid(), "age_s": 0.0,
                                  "stats": {}}
    with Client(paths, config) as client:
        stream = client.generate("hi", stream=True, max_tokens=5)
        assert next(stream).text == "w0"
        engine.crash("server")
        time.sleep(3 * config.heartbeat_interval_s)
        assert "".join(d.text for d in stream) == " w1 w2 w3 w4"
        assert client.generate("hi", max_tokens=2).text == "w0 w1"
