import secrets
from multiprocessing import shared_memory

import numpy as np
import pytest

from tessera.scheduler_proc.page_table import RowPool, SharedPageTable


def test_shared_table_is_visible_to_an_attached_reader_and_unlinked_on_close() -> None:
    name = f"tessera_test_{secrets.token_hex(4)}_req_to_token"
    table = SharedPageTable(name, rows=4, width=32)
    assert table.array.shape == (4, 32) and not table.array.any()
    table.array[2, :3] = [16, 17, 18]
    reader = shared_memory.SharedMemory(name=name)  # same process: same resource tracker
    view = np.ndarray((4, 32), dtype=np.int32, buffer=reader.buf)
    assert view[2, :3].tolist() == [16, 17, 18]
    del view
    reader.close()
    table.close()
    table.close()  # idempotent
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name=name)


def test_a_stale_table_from_a_crashed_run_is_replaced() -> None:
    name = f"tessera_test_{secrets.token_hex(4)}_req_to_token"
    stale = shared_memory.SharedMemory(name=name, create=True, size=64)
    stale.buf[:4] = b"\x01\x02\x03\x04"
    stale.close()
    table = SharedPageTable(name, rows=2, width=8)
    try:
        assert not table.array.any()
    finally:
        table.close()


def test_row_pool_hands_out_each_row_once() -> None:
    pool = RowPool(3)
    rows = [pool.alloc() for _ in range(3)]
    assert sorted(rows) == [0, 1, 2] and pool.free_rows == 0
    pool.free(rows[1])
    assert pool.alloc() == rows[1]
