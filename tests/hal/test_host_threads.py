"""How a worker sets up its host threads: OpenMP's passive wait policy unless the user chose
one, and the intra-op thread count (--intra-op-threads, else a share of the cores)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tessera.config import EngineConfig
from tessera.hal import host_threads


def test_wait_policy_is_passive_unless_the_user_chose_one() -> None:
    env: dict[str, str] = {}
    assert host_threads.set_wait_policy(env) == "PASSIVE"
    assert env == {"OMP_WAIT_POLICY": "PASSIVE"}
    mine = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert host_threads.set_wait_policy(mine) == "ACTIVE"
    assert mine == {"OMP_WAIT_POLICY": "ACTIVE"}


def test_thread_count_is_the_flag_else_a_share_of_the_cores() -> None:
    assert host_threads.thread_count(3, ranks_on_host=1, cores=16) == 3
    assert host_threads.thread_count(0, ranks_on_host=1, cores=16) == 16
    assert host_threads.thread_count(0, ranks_on_host=4, cores=16) == 4
    assert host_threads.thread_count(0, ranks_on_host=4, cores=2) == 1
    with pytest.raises(ValueError, match="intra-op-threads"):
        host_threads.thread_count(-1, ranks_on_host=1, cores=2)


def test_negative_intra_op_threads_is_refused_by_the_config() -> None:
    with pytest.raises(ValueError, match="intra_op_threads"):
        EngineConfig(intra_op_threads=-2)
    assert EngineConfig(intra_op_threads=2).intra_op_threads == 2


def test_apply_sets_torch_threads_in_a_fresh_process() -> None:
    code = ("from tessera.hal import host_threads as h; import os; h.set_wait_policy(); "
            "n = h.apply_thread_count(1, 1); import torch; "
            "print(n, torch.get_num_threads(), os.environ['OMP_WAIT_POLICY'])")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env, check=True).stdout.split()
    assert out == ["1", "1", "PASSIVE"]
