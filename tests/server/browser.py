"""A headless Chromium driven over the DevTools protocol (a WebSocket, through aiohttp), for the
status page's browser test: open a page, evaluate JavaScript in it, take a screenshot.

Debian's `chromium` package is the browser (`.ci/run` installs it); `TESSERA_BROWSER` names
another binary. No browser download and no driver package: the protocol is a few JSON
messages.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str | None:
    named = os.environ.get("TESSERA_BROWSER")
    if named:
        return shutil.which(named) or (named if os.path.exists(named) else None)
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


class Browser:
    """One headless browser with one page. Use as `async with Browser(path) as b:`."""

    def __init__(self, binary: str, width: int = 1400, height: int = 900) -> None:
        self.binary = binary
        self.size = (width, height)
        self.profile = tempfile.mkdtemp(prefix="tessera-browser-")
        self.proc: subprocess.Popen[bytes] | None = None
        self.session: aiohttp.ClientSession | None = None
        self.ws: Any = None
        self._ids = itertools.count(1)

    async def __aenter__(self) -> Browser:
        w, h = self.size
        self.proc = subprocess.Popen(
            [self.binary, "--headless=new", "--no-sandbox", "--disable-gpu",
             "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
             "--disable-extensions", "--remote-debugging-port=0",
             f"--user-data-dir={self.profile}", f"--window-size={w},{h}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        port = await self._devtools_port(30.0)
        self.session = aiohttp.ClientSession()
        async with self.session.get(f"http://127.0.0.1:{port}/json/list") as resp:
            targets = await resp.json(content_type=None)
        page = next(t for t in targets if t.get("type") == "page")
        self.ws = await self.session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        await self.call("Page.enable")
        await self.call("Runtime.enable")
        return self

    async def _devtools_port(self, timeout_s: float) -> int:
        """The port the browser chose, from the file it writes into its profile."""
        path = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.binary} exited with code {self.proc.returncode}")
            if path.exists():
                first = path.read_text().split("\n", 1)[0].strip()
                if first.isdigit():
                    return int(first)
            await asyncio.sleep(0.1)
        raise RuntimeError(f"{self.binary} opened no DevTools port within {timeout_s:g} s")

    async def __aexit__(self, *exc: object) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self.session is not None:
            await self.session.close()
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.profile, ignore_errors=True)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one DevTools command and wait for its answer (events in between are
        dropped)."""
        msg_id = next(self._ids)
        await self.ws.send_str(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            msg = await asyncio.wait_for(self.ws.receive(), 60.0)
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise RuntimeError(f"DevTools connection ended: {msg.type}")
            data = json.loads(msg.data)
            if data.get("id") == msg_id:
                if "error" in data:
                    raise RuntimeError(f"{method}: {data['error']}")
                return dict(data.get("result", {}))

    async def open(self, url: str) -> None:
        await self.call("Page.navigate", url=url)
        await self.wait_for("document.readyState === 'complete'", 30.0)

    async def js(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = await self.call("Runtime.evaluate", expression=expression,
                                 returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float) -> Any:
        """Poll until the expression is truthy; its value."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = await self.js(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"still false after {timeout_s:g} s: {expression}")
            await asyncio.sleep(0.1)

    async def screenshot(self, path: str) -> None:
        shot = await self.call("Page.captureScreenshot", format="png")
        Path(path).write_bytes(base64.b64decode(shot["data"]))
