"""The radix cache, by example and against a plain reference model (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tessera.scheduler_proc.radix_cache import Node, RadixCache

PS = 2


def toks(*values: int) -> np.ndarray:
    return np.asarray(values, dtype=np.int32)


def test_match_is_page_granular() -> None:
    cache = RadixCache(page_size=4)
    path, _ = cache.insert(toks(1, 2, 3, 4, 5, 6, 7, 8, 9), toks(10, 11))
    assert path.tolist() == [10, 11]  # the 9th token is not a whole page: not cached
    pages, node = cache.match(toks(1, 2, 3, 4, 5, 6, 7, 9))
    assert pages.tolist() == [10]
    assert node.page == 10
    pages, node = cache.match(toks(1, 2, 3))
    assert pages.tolist() == [] and node is cache.root


def test_matched_pages_counts_what_match_finds_without_touching_the_tree() -> None:
    cache = RadixCache(page_size=4)
    cache.insert(toks(1, 2, 3, 4, 5, 6, 7, 8, 9), toks(10, 11))
    stamps = [n.last_access for n in cache.nodes()]
    for query in (toks(1, 2, 3, 4, 5, 6, 7, 8), toks(1, 2, 3, 4, 5, 6, 7, 9), toks(1, 2, 3),
                  toks(9, 9, 9, 9)):
        seen = cache.matched_pages(query)
        assert [n.last_access for n in cache.nodes()] == stamps  # LRU order untouched
        assert seen == cache.match(query)[0].shape[0]
        stamps = [n.last_access for n in cache.nodes()]


def test_insert_keeps_existing_pages_and_reports_them() -> None:
    cache = RadixCache(page_size=2)
    cache.insert(toks(1, 2, 3, 4), toks(5, 6))
    path, node = cache.insert(toks(1, 2, 3, 4, 7, 8), toks(50, 60, 70))
    assert path.tolist() == [5, 6, 70]  # 50 and 60 are duplicates the caller must free
    assert node.page == 70
    assert cache.total_pages == 3
    cache.check()


def test_lru_evicts_least_recently_used_unlocked_leaves_first() -> None:
    cache = RadixCache(page_size=1)
    cache.insert(toks(1, 2), toks(10, 11))
    cache.insert(toks(3, 4), toks(30, 31))
    cache.insert(toks(5), toks(50))
    cache.match(toks(1, 2))  # 1,2 are now the most recent
    _, locked = cache.match(toks(5))
    cache.lock(locked)  # 5 is in use: never evicted
    assert cache.evict(1).tolist() == [31]
    assert cache.evict(1).tolist() == [30]  # its parent became a leaf
    assert cache.evict(10).tolist() == [11, 10]
    assert cache.evictable_pages == 0 and cache.protected_pages == 1
    cache.unlock(locked)
    assert cache.evict(10).tolist() == [50]
    cache.check()


def test_lock_protects_the_whole_path() -> None:
    cache = RadixCache(page_size=1)
    _, leaf = cache.insert(toks(1, 2, 3), toks(10, 11, 12))
    _, mid = cache.match(toks(1, 2))
    cache.lock(leaf)
    assert cache.protected_pages == 3 and cache.evictable_pages == 0
    assert cache.evict(3).tolist() == []
    cache.lock(mid)
    cache.unlock(leaf)
    assert cache.evict(3).tolist() == [12]
    cache.unlock(mid)
    assert sorted(cache.evict(3).tolist()) == [10, 11]
    cache.check()


class RadixVsReference(RuleBasedStateMachine):
    """The tree against a dict of cached page-prefixes with per-prefix lock counts."""

    def __init__(self) -> None:
        super().__init__()
        self.cache = RadixCache(PS)
        self.ref: dict[tuple[int, ...], int] = {}  # token prefix (whole pages) -> page
        self.locks: dict[tuple[int, ...], int] = {}  # prefix -> lock count (path-inclusive)
        self.held: list[tuple[Node, tuple[int, ...]]] = []
        self.next_page = 1

    def _prefixes(self, key: tuple[int, ...]) -> list[tuple[int, ...]]:
        return [key[:i] for i in range(PS, len(key) + 1, PS)]

    @rule(tokens=st.lists(st.integers(1, 3), max_size=8))
    def insert(self, tokens: list[int]) -> None:
        n = len(tokens) // PS
        pages = np.arange(self.next_page, self.next_page + n, dtype=np.int32)
        self.next_page += n
        path, node = self.cache.insert(np.asarray(tokens, dtype=np.int32), pages)
        expected = []
        for i, prefix in enumerate(self._prefixes(tuple(tokens[:n * PS]))):
            self.ref.setdefault(prefix, int(pages[i]))
            expected.append(self.ref[prefix])
        assert path.tolist() == expected
        assert node.page == (expected[-1] if expected else -1)

    @rule(tokens=st.lists(st.integers(1, 3), max_size=8), lock=st.booleans())
    def match(self, tokens: list[int], lock: bool) -> None:
        pages, node = self.cache.match(np.asarray(tokens, dtype=np.int32))
        expected = []
        for prefix in self._prefixes(tuple(tokens[:len(tokens) // PS * PS])):
            if prefix not in self.ref:
                break
            expected.append(self.ref[prefix])
        assert pages.tolist() == expected
        if lock and expected:
            key = tuple(tokens[:len(expected) * PS])
            self.cache.lock(node)
            self.held.append((node, key))
            for prefix in self._prefixes(key):
                self.locks[prefix] = self.locks.get(prefix, 0) + 1

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 100))
    def unlock(self, i: int) -> None:
        node, key = self.held.pop(i % len(self.held))
        self.cache.unlock(node)
        for prefix in self._prefixes(key):
            self.locks[prefix] -= 1

    @rule(n=st.integers(0, 6))
    def evict(self, n: int) -> None:
        unlocked = [p for p in self.ref if self.locks.get(p, 0) == 0]
        evicted = self.cache.evict(n).tolist()
        assert len(evicted) == min(n, len(unlocked))
        by_page = {page: prefix for prefix, page in self.ref.items()}
        for page in evicted:
            prefix = by_page[page]
            assert self.locks.get(prefix, 0) == 0, "evicted a locked page"
            del self.ref[prefix]
        # What remains is prefix-closed: an evicted page never leaves an orphan.
        for prefix in self.ref:
            assert all(p in self.ref for p in self._prefixes(prefix))

    @invariant()
    def consistent(self) -> None:
        self.cache.check()
        assert sorted(self.cache.pages().tolist()) == sorted(self.ref.values())
        locked = sum(1 for p in self.ref if self.locks.get(p, 0) > 0)
        assert self.cache.protected_pages == locked
        assert self.cache.evictable_pages == len(self.ref) - locked


TestRadixVsReference = RadixVsReference.TestCase
TestRadixVsReference.settings = settings(max_examples=150, stateful_step_count=40,
                                         deadline=None)


def test_version_changes_exactly_when_pages_enter_or_leave() -> None:
    cache = RadixCache(page_size=2)
    v0 = cache.version
    path, node = cache.insert(toks(1, 2, 3, 4), toks(5, 6))
    v1 = cache.version
    assert v1 != v0
    cache.insert(toks(1, 2, 3, 4), toks(7, 8))  # already there: nothing enters
    cache.match(toks(1, 2, 3, 4))
    cache.lock(node)
    cache.unlock(node)
    assert cache.version == v1
    assert cache.evict(1).tolist() == [6]
    assert cache.version != v1
