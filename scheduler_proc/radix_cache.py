"""RadixAttention prefix cache: a tree of token sequences over KV pages.

Each node below the root stands for one *full* page: its key is that page's `page_size` token
ids (as bytes), its value the KV page that holds their keys and values given the path above it.
Matching is therefore at page granularity: a prompt reuses the longest run of whole pages that
an earlier request already computed.

Reference counts: `lock(node)` adds one reference to the node and every ancestor (a running
request relies on the whole path); `unlock(node)` removes it. Invariants kept here:
  * lock_ref(parent) >= lock_ref(child) for every edge, so a locked node's ancestors are locked;
  * `evictable_pages` counts nodes with lock_ref == 0, `protected_pages` those with > 0, and
    their sum is the number of pages the tree holds;
  * `_leaves` is exactly the set of unlocked nodes without children: the only nodes `evict`
    may remove, least recently used first. A locked page is never evicted.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

import numpy as np


class Node:
    __slots__ = ("key", "page", "parent", "children", "lock_ref", "last_access")

    def __init__(self, key: bytes, page: int, parent: Node | None) -> None:
        self.key = key
        self.page = page
        self.parent = parent
        self.children: dict[bytes, Node] = {}
        self.lock_ref = 0
        self.last_access = 0

    def __lt__(self, other: Node) -> bool:  # heap order on ties of last_access
        return self.page < other.page


class RadixCache:
    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.root = Node(b"", -1, None)
        self.root.lock_ref = 1  # never evicted, never counted
        self.evictable_pages = 0
        self.protected_pages = 0
        self._leaves: set[Node] = set()
        self._clock = 0
        self.version = 0  # bumps whenever a page enters or leaves the tree

    # -- lookup ------------------------------------------------------------------------------
    def _chunks(self, tokens: np.ndarray) -> Iterator[bytes]:
        ps = self.page_size
        n = tokens.shape[0] // ps
        flat = np.ascontiguousarray(tokens[:n * ps], dtype=np.int32)
        for i in range(n):
            yield flat[i * ps:(i + 1) * ps].tobytes()

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def match(self, tokens: np.ndarray) -> tuple[np.ndarray, Node]:
        """Pages of the longest cached run of whole pages prefixing `tokens`, and its last node
        (the root if nothing matched). Marks the path as used now (LRU)."""
        now = self._tick()
        node = self.root
        pages: list[int] = []
        for key in self._chunks(tokens):
            child = node.children.get(key)
            if child is None:
                break
            node = child
            node.last_access = now
            pages.append(node.page)
        return np.asarray(pages, dtype=np.int32), node

    def matched_pages(self, tokens: np.ndarray) -> int:
        """How many whole pages of `tokens` `match` would find, without touching the tree
        (scheduling policies rank waiting requests with it)."""
        node, n = self.root, 0
        for key in self._chunks(tokens):
            node = node.children.get(key)  # type: ignore[assignment]
            if node is None:
                break
            n += 1
        return n

    # -- insertion -----------------------------------------------------------------------------
    def insert(self, tokens: np.ndarray, pages: np.ndarray) -> tuple[np.ndarray, Node]:
        """Cache the whole pages of `tokens`, whose KV lives in `pages` (one per page).

        Where a page's tokens are already cached, the tree keeps its own page. Returns the
        tree's pages for the whole path (compare with `pages`: where they differ, the caller's
        page is a duplicate it must free) and the path's last node.
        """
        now = self._tick()
        node = self.root
        n_pages = tokens.shape[0] // self.page_size
        if pages.shape[0] < n_pages:
            raise ValueError(f"{n_pages} pages of tokens but only {pages.shape[0]} pages given")
        path = np.empty(n_pages, dtype=np.int32)
        for i, key in enumerate(self._chunks(tokens)):
            child = node.children.get(key)
            if child is None:
                child = Node(key, int(pages[i]), node)
                self.version += 1
                if not node.children:
                    self._leaves.discard(node)
                node.children[key] = child
                self.evictable_pages += 1
                self._leaves.add(child)
            child.last_access = now
            path[i] = child.page
            node = child
        return path, node

    # -- references ----------------------------------------------------------------------------
    def lock(self, node: Node) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_pages -= 1
                self.protected_pages += 1
                self._leaves.discard(node)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: Node) -> None:
        while node is not self.root:
            if node.lock_ref <= 0:
                raise RuntimeError("unlock of a radix node that is not locked")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_pages += 1
                self.protected_pages -= 1
                if not node.children:
                    self._leaves.add(node)
            node = node.parent  # type: ignore[assignment]

    # -- eviction ------------------------------------------------------------------------------
    def evict(self, n_pages: int) -> np.ndarray:
        """Remove up to `n_pages` unlocked pages, least recently used leaves first; return them
        (the caller gives them back to the allocator)."""
        if n_pages <= 0 or not self._leaves:
            return np.zeros(0, dtype=np.int32)
        heap = [(leaf.last_access, leaf) for leaf in self._leaves]
        heapq.heapify(heap)
        freed: list[int] = []
        while heap and len(freed) < n_pages:
            _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key]
            self._leaves.discard(leaf)
            self.evictable_pages -= 1
            freed.append(leaf.page)
            self.version += 1
            leaf.parent = None
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                self._leaves.add(parent)
                heapq.heappush(heap, (parent.last_access, parent))
        return np.asarray(freed, dtype=np.int32)

    def evict_all(self) -> np.ndarray:
        """Drop every unreferenced page (FlushCache)."""
        return self.evict(self.evictable_pages)

    # -- inspection ----------------------------------------------------------------------------
    @property
    def total_pages(self) -> int:
        return self.evictable_pages + self.protected_pages

    def nodes(self) -> Iterator[Node]:
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def pages(self) -> np.ndarray:
        return np.asarray([n.page for n in self.nodes()], dtype=np.int32)

    def check(self) -> None:
        """Raise AssertionError if a structural invariant (module docstring) does not hold."""
        evictable = protected = 0
        leaves: set[Node] = set()
        for node in self.nodes():
            parent = node.parent
            assert parent is not None and parent.children.get(node.key) is node, "broken edge"
            assert node.lock_ref >= 0, "negative lock_ref"
            if parent is not self.root:
                assert parent.lock_ref >= node.lock_ref, "child locked more than its parent"
            if node.lock_ref == 0:
                evictable += 1
                if not node.children:
                    leaves.add(node)
            else:
                protected += 1
        assert evictable == self.evictable_pages, f"{evictable} != {self.evictable_pages}"
        assert protected == self.protected_pages, f"{protected} != {self.protected_pages}"
        assert leaves == self._leaves, "evictable leaf set out of date"
        pages = self.pages()
        assert np.unique(pages).shape[0] == pages.shape[0], "a page appears twice in the tree"
