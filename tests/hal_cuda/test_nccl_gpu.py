"""NCCL through the cuda plugin on two GPUs: collectives, and an all_reduce inside a captured
CUDA graph (what tensor-parallel decode replays)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tessera.child_env import child_env

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")]


def _run_ranks(script_name: str, tmp_path: Path) -> list[dict]:
    """Run this folder's `script_name` as ranks 0 and 1 of a two-GPU group; each rank's
    JSON result, after both exited 0 within 180 s."""
    script = Path(__file__).with_name(script_name)
    init = f"file://{tmp_path / 'store'}"
    procs = [subprocess.Popen([sys.executable, str(script), str(rank), "2", init,
                               str(tmp_path / f"rank{rank}.json")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=child_env()) for rank in range(2)]
    logs = []
    for proc in procs:
        try:
            logs.append(proc.communicate(timeout=180)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail(f"{script_name} ranks did not finish in 180 s")
    for rank, proc in enumerate(procs):
        assert proc.returncode == 0, f"rank {rank} failed:\n{logs[rank][-3000:]}"
    return [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]


def test_nccl_collectives_and_captured_all_reduce(tmp_path: Path) -> None:
    for rank, got in enumerate(_run_ranks("nccl_rank.py", tmp_path)):
        assert got["eager"] == [3.0]
        assert got["gathered"] == [[0.0, 0.0, 0.0, 1.0, 1.0, 1.0]] * 2
        # sum over ranks of arange(8).view(2, 4) + rank is 2 * arange + 1; rank r keeps
        # columns 2r, 2r + 1
        full = (2 * torch.arange(8.0).view(2, 4) + 1)
        assert got["scattered"] == full[:, 2 * rank:2 * rank + 2].tolist()
        # replay i: sum over ranks of 2 * (rank + 10 i) = 2 + 40 i
        assert got["replays"] == [[2.0 + 40.0 * i] for i in range(3)]


def test_one_shot_all_reduce_equals_nccl(tmp_path: Path) -> None:
    """The one-shot all-reduce over peer memory (no multicast) gives NCCL's sums bit for bit,
    eagerly and inside a captured graph, bf16 and fp32, and small all-gathers through it
    NCCL's gathers; larger tensors go through NCCL."""
    for got in _run_ranks("one_shot_rank.py", tmp_path):
        for dtype in ("bfloat16", "float32"):
            part = got[dtype]
            assert part["chosen"].startswith("one-shot"), part["chosen"]
            assert part["limit"] >= 2 << 20
            assert part["eager_equal"] == [True] * 4, (dtype, part)
            assert part["gather_equal"] == [True] * 4, (dtype, part)
            assert part["replay_equal"] == [True] * 3, (dtype, part)
            assert part["over_limit_ok"], (dtype, part)
