"""One streamed request to an OpenAI-compatible server, timed: TTFT, the gap before every
later chunk (ITL), end-to-end latency, and the usage the server reports (cached tokens too).

Prompts are token ids sent to `/v1/completions` (OpenAI accepts a list of ints as the prompt),
so that no tokenizer is needed on the client side and prompt lengths are exact.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from tessera.benchmarks.datasets import BenchRequest


@dataclass
class RequestMetrics:
    ok: bool
    prompt_len: int
    output_tokens: int = 0
    ttft_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)  # gap before each chunk after the first
    e2e_s: float = 0.0
    start_s: float = 0.0  # when it was sent, relative to the start of its tier
    cached_tokens: int | None = None  # from usage.prompt_tokens_details, if the server says
    error: str = ""
    text: str = ""  # what was streamed (completions API)
    finish_reason: str | None = None

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first."""
        if self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


def completion_body(model: str | None, req: BenchRequest, *, ignore_eos: bool = True,
                    temperature: float = 0.0) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt": req.prompt_ids if req.prompt_text is None else req.prompt_text,
        "max_tokens": req.output_len,
        "temperature": temperature,
        "ignore_eos": ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if model:
        body["model"] = model
    return body


def native_body(req: BenchRequest, *, ignore_eos: bool = True,
                temperature: float = 0.0) -> dict[str, Any]:
    """SGLang's /generate: streams cumulative `output_ids`, so every token is seen even when
    its text is empty (a model without a tokenizer, a partial UTF-8 character)."""
    return {"input_ids": req.prompt_ids, "stream": True,
            "sampling_params": {"max_new_tokens": req.output_len, "temperature": temperature,
                                "ignore_eos": ignore_eos}}


class EventReader:
    """Turns the stream's events into (new tokens in this event, usage) for either API."""

    def __init__(self, api: str) -> None:
        self.api = api
        self.seen = 0  # native: output ids so far

    def read(self, data: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
        if self.api == "native":
            ids = data.get("output_ids") or []
            new, self.seen = len(ids) - self.seen, max(self.seen, len(ids))
            meta = data.get("meta_info") or {}
            usage = None
            if meta.get("finish_reason"):
                usage = {"completion_tokens": meta.get("completion_tokens", len(ids)),
                         "prompt_tokens_details": {"cached_tokens": meta.get("cached_tokens")}}
            return max(new, 0), usage
        chunks = sum(1 for c in data.get("choices") or [] if c.get("text") or c.get("logprobs"))
        return chunks, data.get("usage") or None


API_PATHS = {"completions": "/v1/completions", "native": "/generate"}


def parse_sse_line(line: bytes) -> dict[str, Any] | None:
    """The JSON object of one `data: {...}` line; None for other lines and `[DONE]`."""
    text = line.decode("utf-8", errors="replace").strip()
    if not text.startswith("data:"):
        return None
    payload = text[5:].strip()
    if not payload or payload == "[DONE]":
        return None
    return json.loads(payload)


async def send_request(session: Any, url: str, req: BenchRequest, *, model: str | None = None,
                       api_key: str | None = None, ignore_eos: bool = True,
                       t_origin: float = 0.0, api: str = "completions",
                       extra_body: dict[str, Any] | None = None) -> RequestMetrics:
    """POST one streaming request and time it. Never raises: failures are in the result.
    `url` is the endpoint (API_PATHS[api] under the server's base URL); `extra_body`: more
    request fields (a response_format, ...)."""
    import aiohttp

    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    body = native_body(req, ignore_eos=ignore_eos) if api == "native" else \
        completion_body(model, req, ignore_eos=ignore_eos)
    if extra_body:
        body.update(extra_body)
    m = RequestMetrics(ok=False, prompt_len=req.prompt_len)
    start = time.perf_counter()
    m.start_s = start - t_origin if t_origin else 0.0
    last = start
    tokens = 0
    reader = EventReader(api)
    usage: dict[str, Any] | None = None
    try:
        async with session.post(url, json=body, headers=headers) as resp:
            if resp.status != 200:
                m.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                m.e2e_s = time.perf_counter() - start
                return m
            async for line in resp.content:
                data = parse_sse_line(line)
                if data is None:
                    continue
                if "error" in data:
                    m.error = str(data["error"])[:300]
                    break
                new, event_usage = reader.read(data)
                usage = event_usage or usage
                for choice in data.get("choices") or []:
                    m.text += choice.get("text") or ""
                    m.finish_reason = choice.get("finish_reason") or m.finish_reason
                if new <= 0:
                    continue
                now = time.perf_counter()
                if tokens == 0:
                    m.ttft_s = now - start
                else:
                    m.itl_s.append(now - last)
                last = now
                tokens += new
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        m.error = f"{type(exc).__name__}: {exc}"[:300]
    m.e2e_s = time.perf_counter() - start
    m.output_tokens = int((usage or {}).get("completion_tokens") or tokens)
    details = (usage or {}).get("prompt_tokens_details") or {}
    if details.get("cached_tokens") is not None:
        m.cached_tokens = int(details["cached_tokens"])
    m.ok = not m.error and tokens > 0
    if not m.ok and not m.error:
        m.error = "the stream ended without output"
    return m


async def fetch_text(session: Any, url: str, api_key: str | None = None) -> str | None:
    """GET a text endpoint (/metrics); None if it is not there."""
    import aiohttp

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with session.get(url, headers=headers) as resp:
            return await resp.text() if resp.status == 200 else None
    except aiohttp.ClientError:
        return None


def parse_prometheus(text: str) -> dict[str, float]:
    """name{labels} -> value for every sample line of a Prometheus text exposition."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        parts = line.rsplit(" ", 1)
        if len(parts) != 2:
            continue
        try:
            out[parts[0]] = float(parts[1])
        except ValueError:
            continue
    return out
