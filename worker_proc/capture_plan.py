"""What start-up captures: only step shapes that can occur, with the garbage collector quiet.

A decode batch holds at most --max-running-requests requests, --graph-max-bs, what the
plugin can capture, and one request per KV page (each running request writes into a page of
its own; page 0 is reserved). A prefill or mixed step holds at most the prefill chunk plus one
token per running request (--chunked-prefill-size + --max-running-requests, with speculative
decoding 1 + --speculative-num-draft-tokens per request; unbounded without chunking), --graph-max-tokens, and the KV slots there are. Graphs for larger shapes would never
replay: capturing them only costs start-up time and graph memory.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from tessera.config import EngineConfig


def decode_batch_limit(config: EngineConfig, plugin_max_batch: int | None,
                       num_pages: int) -> int:
    return max(0, min(config.graph_max_bs, config.max_running_requests,
                      plugin_max_batch or config.graph_max_bs, num_pages - 1))


def mixed_token_limit(config: EngineConfig, num_slots: int) -> int:
    limit = min(config.graph_max_tokens, num_slots)
    if config.chunked_prefill_size > 0:
        # each running request decodes one token, or verifies it with its proposals
        per_request = 1
        if config.speculative_algorithm != "none":
            per_request += config.speculative_num_draft_tokens
        limit = min(limit, config.chunked_prefill_size
                    + config.max_running_requests * per_request)
    return max(0, limit)


@contextmanager
def quiet_gc() -> Iterator[None]:
    """Collect once, then keep the collector off while graphs are captured: a collection in
    the middle of a capture walks every Python object for nothing (and may free a tensor
    another graph still holds), and a loop of captures triggers many."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def capture_batch_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then steps of 8 up to 64, then steps of 16 up to max_bs (max_bs included)."""
    if max_bs < 1:
        return []
    sizes = [s for s in (1, 2, 4, 8) if s <= max_bs]
    sizes += list(range(16, min(max_bs, 64) + 1, 8))
    sizes += list(range(80, max_bs + 1, 16))
    if sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


def padded_batch_size(batch: int, sizes: Iterable[int]) -> int | None:
    """The smallest captured size that holds `batch`, or None (run eagerly)."""
    fits = [s for s in sizes if s >= batch]
    return min(fits) if fits else None


def token_buckets(max_tokens: int) -> list[int]:
    """32, 64, 96, 128, 192, 256, then steps of 64 up to 512, of 128 up to 1024 and of 256
    beyond, up to max_tokens (included). Up to about 256 tokens a step's matmuls cost what
    reading the weights costs, so padding is nearly free there; beyond, it is compute and the
    steps are finer."""
    if max_tokens < 1:
        return []
    sizes = [32, 64, 96, 128, 192, 256]
    sizes += list(range(320, 513, 64)) + list(range(640, 1025, 128))
    sizes += list(range(1280, max_tokens + 1, 256))
    sizes = [s for s in sizes if s <= max_tokens]
    if not sizes or sizes[-1] != max_tokens:
        sizes.append(max_tokens)
    return sizes
