"""Error codes tie a message to its row of docs/troubleshooting.md: every code has a row, every
row a code, and the messages of the symptoms that have one carry it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tessera import codes

ROOT = Path(__file__).parents[1]
# Symptoms no single message reports (found from metrics and comparisons): the page only.
PAGE_ONLY = {codes.MEMORY_GROWS, codes.GARBLED_OUTPUT, codes.P99_JUMPS}


def test_every_code_has_one_row_and_every_row_a_code() -> None:
    page = (ROOT / codes.DOC).read_text()
    rows = re.findall(r"^\| (T\d{3}) \|", page, flags=re.MULTILINE)
    assert sorted(rows) == sorted(codes.ALL) and len(set(rows)) == len(rows)
    values = [v for k, v in vars(codes).items() if re.fullmatch(r"[A-Z0-9_]+", k)
              and isinstance(v, str) and re.fullmatch(r"T\d{3}", v)]
    assert sorted(values) == sorted(codes.ALL)


def test_every_message_code_is_used_by_a_message() -> None:
    names = {v: k for k, v in vars(codes).items() if k.isupper() and isinstance(v, str)}
    sources = [p.read_text() for folder in ("bus", "hal", "worker_proc", "client", "server",
                                            "scheduler_proc", "formats", "tessera")
               for p in (ROOT / folder).rglob("*.py") if p.name != "codes.py"]
    for code in set(codes.ALL) - PAGE_ONLY:
        name = names[code]
        assert any(f"coded({name})" in src for src in sources), f"{name} ({code}) unused"


def test_a_missing_plugin_names_its_code() -> None:
    from tessera.hal.errors import PluginNotFoundError
    from tessera.hal.registry import load_platform

    with pytest.raises(PluginNotFoundError, match=r"\[T102, docs/troubleshooting.md\]"):
        load_platform("no-such-chip")


def test_an_open_breaker_names_its_code() -> None:
    from tessera.bus.breaker import CircuitOpenError

    assert str(CircuitOpenError("scheduler", 2.0, "3 timeouts")).endswith(
        "[T112, docs/troubleshooting.md]")


@pytest.mark.parametrize("max_total_tokens", [None, 1_000_000])
def test_too_little_kv_memory_names_its_code(max_total_tokens: int | None) -> None:
    from tessera.hal.platform import MemoryPolicy
    from tessera.worker_proc.kv_sizing import plan_kv

    with pytest.raises(MemoryError, match=r"\[T107, docs/troubleshooting.md\]"):
        plan_kv(free_bytes_now=2**20, free_bytes_before_weights=2**30, policy=MemoryPolicy(),
                mem_fraction=0.5, max_total_tokens=max_total_tokens, page_size=16,
                bytes_per_slot=2**16, max_context_len=4096, max_running_requests=8)
