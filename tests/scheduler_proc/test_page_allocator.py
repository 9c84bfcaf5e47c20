import numpy as np
import pytest

from tessera.scheduler_proc.page_allocator import OutOfPages, PageAllocator


def test_page_zero_is_never_handed_out() -> None:
    alloc = PageAllocator(num_slots=16 * 8, page_size=16)
    assert alloc.total_pages == 7
    pages = alloc.alloc(7)
    assert sorted(pages.tolist()) == list(range(1, 8))
    assert alloc.free_pages == 0
    with pytest.raises(OutOfPages):
        alloc.alloc(1)


def test_free_returns_pages_and_alloc_reuses_them() -> None:
    alloc = PageAllocator(num_slots=4 * 10, page_size=4, debug=True)
    a = alloc.alloc(3)
    b = alloc.alloc(2)
    assert not set(a.tolist()) & set(b.tolist())
    alloc.free(a)
    assert alloc.free_pages == 9 - 2
    c = alloc.alloc(7)
    assert set(c.tolist()) == set(range(1, 10)) - set(b.tolist())


def test_double_free_is_caught_in_debug_mode() -> None:
    alloc = PageAllocator(num_slots=4 * 10, page_size=4, debug=True)
    a = alloc.alloc(2)
    alloc.free(a)
    with pytest.raises(ValueError, match="double free"):
        alloc.free(a[:1])
    with pytest.raises(ValueError, match="outside"):
        alloc.free(np.array([0], dtype=np.int32))


def test_too_small_arena_is_refused_with_a_reason() -> None:
    with pytest.raises(ValueError, match="page 0 is reserved"):
        PageAllocator(num_slots=16, page_size=16)
