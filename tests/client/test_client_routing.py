"""Which tokenizer gets a request: every worker of `--tokenizer-workers N`, and a request's
abort goes to the worker that has the request. The run directory's config is used when the
caller gives none."""

from __future__ import annotations

import time

from tessera.bus.channel import Inbox
from tessera.bus.messages import AbortRequest, GenerateRequest
from tessera.bus.run_paths import RunPaths
from tessera.client import Client
from tessera.client.testing import FakeEngine
from tessera.config import EngineConfig


def test_requests_spread_over_tokenizer_workers_and_aborts_follow(
        paths: RunPaths, engine: FakeEngine) -> None:
    with open(paths.config_file, "w") as f:
        f.write(EngineConfig(tokenizer_workers=2).to_json())
    second = Inbox(paths.tokenizer_endpoint(1), name="tokenizer1")
    try:
        with Client(paths) as client:  # no config given: the run directory's is used
            assert client.config.tokenizer_workers == 2
            streams = [client.generate("HANG", stream=True, rid=f"r{k}") for k in range(16)]
            for stream in streams:
                stream.close()
            got: list = []
            end = time.monotonic() + 2.0
            while time.monotonic() < end and \
                    sum(isinstance(m, AbortRequest) for m in got) + len(engine.aborts) < 16:
                got += second.drain(0.05)
        at_second = {m.rid for m in got if isinstance(m, GenerateRequest)}
        at_first = {r.rid for r in engine.requests}
        assert at_second and at_first  # both workers get requests
        assert at_first | at_second == {f"r{k}" for k in range(16)}
        assert {m.rid for m in got if isinstance(m, AbortRequest)} == at_second
        assert {a.rid for a in engine.aborts} == at_first
    finally:
        second.close()
