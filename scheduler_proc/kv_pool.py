"""The KV pages of running sequences, between the free list and the radix cache.

A running row's pages are `RowState.pages[row, :n_pages]`; the first `tree_pages` of them are
cache pages on the path the sequence locks (`Sequence.last_node`), the rest are its own. Every
page moves between exactly three places (free list, a sequence's own pages, the cache), which
is what keeps `free + held by running + cache-only == total`:
  * `alloc` takes from the free list, evicting unlocked cache pages first when it runs short;
  * `cache_prefix` hands a running sequence's computed whole pages to the cache and locks them;
  * `release` hands them to the cache (or the free list) when the sequence stops.
Only pages whose KV is written (`kv_done`) go to the cache: a page still being written by a step
in flight is never matched by another request.
"""

from __future__ import annotations

import numpy as np

from tessera.scheduler_proc.page_allocator import PageAllocator
from tessera.scheduler_proc.radix_cache import Node, RadixCache
from tessera.scheduler_proc.request import Sequence
from tessera.scheduler_proc.rows import RowState


class KVPool:
    def __init__(self, num_slots: int, page_size: int, st: RowState, use_cache: bool,
                 debug: bool = False) -> None:
        self.page_size = page_size
        self.allocator = PageAllocator(num_slots, page_size, debug=debug)
        self.cache = RadixCache(page_size)
        self.use_cache = use_cache
        self.st = st

    def available(self) -> int:
        """Pages an allocation may get: free ones plus unlocked cache pages."""
        return self.allocator.free_pages + (self.cache.evictable_pages if self.use_cache else 0)

    def alloc(self, n: int) -> np.ndarray:
        short = n - self.allocator.free_pages
        if short > 0 and self.use_cache:
            self.allocator.free(self.cache.evict(short))
        return self.allocator.alloc(n)

    def match(self, tokens: np.ndarray) -> tuple[np.ndarray, Node]:
        """Cached pages for a prompt, locked (unlock through `release`). At least one token
        is left to compute: its logits give the next token."""
        if not self.use_cache:
            return np.zeros(0, dtype=np.int32), self.cache.root
        n = tokens.shape[0]
        pages, node = self.cache.match(tokens[:((n - 1) // self.page_size) * self.page_size])
        self.cache.lock(node)
        return pages, node

    def matched_tokens(self, tokens: np.ndarray) -> int:
        """Prompt tokens `match` would serve from the cache now (nothing is locked)."""
        if not self.use_cache:
            return 0
        usable = ((tokens.shape[0] - 1) // self.page_size) * self.page_size
        return self.cache.matched_pages(tokens[:usable]) * self.page_size

    @property
    def cache_version(self) -> int:
        """Changes whenever what `matched_tokens` can find changes."""
        return self.cache.version

    def unlock(self, node: Node) -> None:
        self.cache.unlock(node)

    def cache_prefix(self, seq: Sequence) -> None:
        """Put the row's computed whole pages in the cache and lock them (prefill done or
        partly done): later requests with the same prefix reuse them at once."""
        st, ps, row = self.st, self.page_size, seq.row
        k = min(int(st.kv_done[row]), int(st.n_known[row])) // ps
        if not self.use_cache or k <= int(st.tree_pages[row]):
            return
        own = st.pages[row, :k].copy()
        path, node = self.cache.insert(st.tokens[row, :k * ps], own)
        dup = own != path
        if dup.any():
            # Someone cached these tokens first: use its pages, free ours. Steps in flight may
            # still read ours through the old slots: both hold the same KV, and ours are
            # reused only by a later step, which runs after them.
            self.allocator.free(own[dup])
            st.pages[row, :k] = path
            st.write_slots(row, int(np.argmax(dup)) * ps, k * ps)
        self.cache.lock(node)
        assert seq.last_node is not None
        self.cache.unlock(seq.last_node)
        seq.last_node = node
        st.tree_pages[row] = k

    def release(self, seq: Sequence, insert: bool) -> None:
        """Give every page of a stopping sequence back: whole pages with KV written to the
        cache (when `insert`), the rest to the free list."""
        st, ps, row = self.st, self.page_size, seq.row
        keep = int(st.tree_pages[row])
        if insert and self.use_cache:
            k = min(int(st.kv_done[row]), int(st.n_known[row])) // ps
            if k > keep:
                own = st.pages[row, :k].copy()
                path, _ = self.cache.insert(st.tokens[row, :k * ps], own)
                self.allocator.free(own[own != path])
                keep = k
        self.allocator.free(st.pages[row, keep:st.n_pages[row]].copy())
        st.n_pages[row] = 0
        st.tree_pages[row] = 0
        if seq.last_node is not None:
            self.cache.unlock(seq.last_node)
            seq.last_node = None

    def flush(self) -> int:
        """Drop every unreferenced cached page; return how many."""
        pages = self.cache.evict_all()
        self.allocator.free(pages)
        return int(pages.shape[0])

    def stats(self, active_rows: np.ndarray) -> dict[str, float]:
        """Page counts, and the page invariant from three independent ledgers (allocator,
        rows, tree counters): cheap enough for every heartbeat."""
        total, free = self.allocator.total_pages, self.allocator.free_pages
        own = int((self.st.n_pages[active_rows] - self.st.tree_pages[active_rows]).sum())
        running = own + self.cache.protected_pages
        cache_only = self.cache.evictable_pages
        return {
            "kv_pages_total": float(total),
            "kv_pages_used": float(total - free),
            "kv_pages_free": float(free),
            "kv_pages_running": float(running),
            "kv_pages_cached": float(cache_only),
            "kv_invariant_ok": float(free + running + cache_only == total),
        }
