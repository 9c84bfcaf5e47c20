"""Free list of KV pages over the worker's arena.

The arena holds `num_slots` token slots; page p owns slots [p * page_size, (p + 1) * page_size).
Page 0 is reserved for padding (hal/platform.py `KVArena`), so usable pages are 1 .. num_pages-1
and `total_pages == num_pages - 1`.

Invariant kept here: every usable page is either on the free stack exactly once, or handed out
exactly once (to a request or to the radix cache). `free()` of a page that is already free is
a bug and raises when `debug` is on (the check is O(n), so it is off on the hot path).
"""

from __future__ import annotations

import numpy as np


class OutOfPages(RuntimeError):
    """Not enough free pages: the caller evicts from the cache or retracts a request."""


class PageAllocator:
    def __init__(self, num_slots: int, page_size: int, debug: bool = False) -> None:
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        self.page_size = page_size
        self.num_pages = num_slots // page_size
        if self.num_pages < 2:
            raise ValueError(f"a KV arena of {num_slots} slots holds fewer than 2 pages of "
                             f"{page_size}: page 0 is reserved, so nothing would be left")
        self.total_pages = self.num_pages - 1
        self.debug = debug
        # A stack: the top is self._free[:self._n_free][-1]. Lowest pages come out first,
        # which keeps a lightly loaded arena compact (easier to read in a debugger).
        self._free = np.arange(self.num_pages - 1, 0, -1, dtype=np.int32)
        self._n_free = self.total_pages

    @property
    def free_pages(self) -> int:
        return self._n_free

    def alloc(self, n: int) -> np.ndarray:
        """Hand out `n` pages (int32 array); raise OutOfPages if fewer are free."""
        if n > self._n_free:
            raise OutOfPages(f"asked for {n} pages, {self._n_free} free")
        start = self._n_free - n
        pages = self._free[start:self._n_free][::-1].copy()
        self._n_free = start
        return pages

    def free(self, pages: np.ndarray) -> None:
        """Return pages to the free stack."""
        n = int(pages.shape[0])
        if n == 0:
            return
        if self.debug:
            self._check_free(pages)
        self._free[self._n_free:self._n_free + n] = pages[::-1]
        self._n_free += n

    def free_page_array(self) -> np.ndarray:
        """A copy of the free pages (for invariant checks)."""
        return self._free[:self._n_free].copy()

    def _check_free(self, pages: np.ndarray) -> None:
        if pages.min() < 1 or pages.max() >= self.num_pages:
            raise ValueError(f"freeing pages outside 1..{self.num_pages - 1}: {pages}")
        if np.unique(pages).shape[0] != pages.shape[0]:
            raise ValueError(f"freeing the same page twice in one call: {pages}")
        already = np.isin(pages, self._free[:self._n_free])
        if already.any():
            raise ValueError(f"double free of pages {pages[already]}")
