"""Start-up captures only shapes that can occur, and keeps the garbage collector quiet."""

from __future__ import annotations

import gc

from tessera.config import EngineConfig
from tessera.worker_proc.capture_plan import decode_batch_limit, mixed_token_limit, quiet_gc


def test_decode_batches_are_bounded_by_requests_plugin_and_pages() -> None:
    cfg = EngineConfig()
    assert decode_batch_limit(cfg, None, num_pages=10_000) == 256
    assert decode_batch_limit(cfg.replace(max_running_requests=48), None, 10_000) == 48
    assert decode_batch_limit(cfg, 64, 10_000) == 64
    # a KV pool of 20 pages (one reserved) never runs more than 19 requests at once
    assert decode_batch_limit(cfg, None, num_pages=20) == 19


def test_mixed_steps_are_bounded_by_chunk_plus_decodes_and_slots() -> None:
    cfg = EngineConfig()
    assert mixed_token_limit(cfg, num_slots=1 << 20) == 1024
    small = cfg.replace(chunked_prefill_size=256, max_running_requests=32)
    assert mixed_token_limit(small, 1 << 20) == 288
    assert mixed_token_limit(cfg.replace(chunked_prefill_size=0), 1 << 20) == 1024
    assert mixed_token_limit(cfg, num_slots=500) == 500
    assert mixed_token_limit(cfg.replace(graph_max_tokens=0), 1 << 20) == 0


def test_quiet_gc_turns_the_collector_off_and_back_on() -> None:
    assert gc.isenabled()
    with quiet_gc():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with quiet_gc():
            pass
        assert not gc.isenabled()  # left as it was found
    finally:
        gc.enable()
