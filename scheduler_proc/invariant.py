"""The page invariant and the bookkeeping it rests on, checked from the outside.

    free + held by running sequences + held only by the cache == total

where "held by running sequences" counts each page once: a sequence's own pages, and the cache
pages on the paths running sequences lock. Also checked: no page is in two places, every
locked cache page is locked by a running sequence, page counts match KV lengths, and the shared
page table holds the right slots for every running row. O(pages + tokens): for tests and
`--debug-invariants` runs, not the hot path.
"""

from __future__ import annotations

import numpy as np

from tessera.scheduler_proc.running import RunningSet


class InvariantError(AssertionError):
    pass


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise InvariantError(message)


def check(running: RunningSet) -> None:
    st, ps, pool = running.st, running.page_size, running.kv
    cache, total = pool.cache, pool.allocator.total_pages
    cache.check()
    free = pool.allocator.free_page_array()
    tree = cache.pages()
    own_parts: list[np.ndarray] = [np.zeros(0, dtype=np.int32)]
    locked: set[int] = set()
    for row, seq in running.seqs.items():
        _require(running.seq_of_row[row] is seq and seq.row == row, f"row {row} bookkeeping")
        _require(int(st.uid[row]) == seq.uid, f"row {row} uid")
        n_pages, tree_pages, kv = int(st.n_pages[row]), int(st.tree_pages[row]), int(st.kv_len[row])
        _require(n_pages == -(-kv // ps), f"row {row}: {n_pages} pages for {kv} KV tokens")
        _require(int(st.kv_done[row]) <= kv <= int(st.n_known[row] + st.pending[row]
                                                    + st.drafts[row]),
                 f"row {row}: kv_done {st.kv_done[row]} kv_len {kv} known {st.n_known[row]}")
        own_parts.append(st.pages[row, tree_pages:n_pages])
        # The row's cache pages are exactly the path its lock covers.
        path: list[int] = []
        node = seq.last_node
        while node is not None and node is not cache.root:
            path.append(node.page)
            node = node.parent
        path.reverse()
        _require(path == st.pages[row, :tree_pages].tolist(),
                 f"row {row}: cache pages {st.pages[row, :tree_pages].tolist()} != locked path "
                 f"{path}")
        locked.update(path)
        pos = np.arange(kv, dtype=np.int32)
        want = st.pages[row, pos // ps] * ps + pos % ps
        _require(bool((st.req_to_token[row, :kv] == want).all()), f"row {row}: page table")
    own = np.concatenate(own_parts)
    protected = {n.page for n in cache.nodes() if n.lock_ref > 0}
    _require(protected == locked, "a cache page is locked by no running sequence "
             f"({sorted(protected - locked)[:8]}) or a running path is unlocked")
    every = np.concatenate([free, tree, own])
    _require(every.shape[0] == total,
             f"free {free.shape[0]} + cache {tree.shape[0]} + own {own.shape[0]} "
             f"!= total {total}")
    _require(np.unique(every).shape[0] == total, "a page is in two places")
    _require(bool((every >= 1).all() and (every <= total).all()), "a page outside 1..total")
    held_by_running = own.shape[0] + cache.protected_pages
    cache_only = cache.evictable_pages
    _require(free.shape[0] + held_by_running + cache_only == total,
             f"free {free.shape[0]} + running {held_by_running} + cache-only {cache_only} "
             f"!= total {total}")
    pending = sum(1 for seq in running.seqs.values() if seq.pending_key is not None)
    _require(pending == running.prefixes.total(), "prefix-in-the-making count")
    rows_in_use = len(running) + len(running.deferred_rows) + running.row_pool.free_rows
    _require(rows_in_use == st.uid.shape[0], f"rows: {rows_in_use} accounted of {st.uid.shape[0]}")
