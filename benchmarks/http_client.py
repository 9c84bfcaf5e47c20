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

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first."""
        if self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


def completion_body(model: str | None, req: BenchRequest, *, ignore_eos: bool = True,
                    temperature: float = 0.0) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt": req.prompt_ids,
        "max_tokens": req.output_len,
        "temperature": temperature,
        "ignore_eos": ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if model:
        body["model"] = model
    return body


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
                       t_origin: float = 0.0) -> RequestMetrics:
    """POST one streaming completion and time it. Never raises: failures are in the result."""
    import aiohttp

    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    m = RequestMetrics(ok=False, prompt_len=req.prompt_len)
    start = time.perf_counter()
    m.start_s = start - t_origin if t_origin else 0.0
    last = start
    chunks = 0
    usage: dict[str, Any] | None = None
    try:
        async with session.post(url, json=completion_body(model, req, ignore_eos=ignore_eos),
                                headers=headers) as resp:
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
                if data.get("usage"):
                    usage = data["usage"]
                if not any(c.get("text") for c in data.get("choices") or []):
                    continue
                now = time.perf_counter()
                if chunks == 0:
                    m.ttft_s = now - start
                else:
                    m.itl_s.append(now - last)
                last = now
                chunks += 1
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        m.error = f"{type(exc).__name__}: {exc}"[:300]
    m.e2e_s = time.perf_counter() - start
    if usage is not None:
        m.output_tokens = int(usage.get("completion_tokens") or chunks)
        details = usage.get("prompt_tokens_details") or {}
        if "cached_tokens" in details:
            m.cached_tokens = int(details["cached_tokens"] or 0)
    else:
        m.output_tokens = chunks
    m.ok = not m.error and chunks > 0
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
