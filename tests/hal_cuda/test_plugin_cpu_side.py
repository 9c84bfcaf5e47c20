"""What the cuda plugin does on a machine without a GPU: import cleanly, say it is
unavailable, and plan its captured batch sizes."""

from __future__ import annotations

import pytest
import torch

from tessera.hal.cuda.graph import capture_batch_sizes, padded_batch_size
from tessera.hal.ops import OP_NAMES


def test_import_needs_no_gpu_and_reports_availability() -> None:
    from tessera.hal.cuda import CudaPlatform

    assert CudaPlatform.name == "cuda"
    assert CudaPlatform.is_available() == torch.cuda.is_available()
    caps = CudaPlatform.capabilities
    assert caps.graph_capture and caps.default_dtype in caps.dtypes
    assert "nccl" in caps.communicator_backends


def test_registry_finds_the_builtin_plugin() -> None:
    from tessera.hal.registry import survey_plugins

    status = {s.spec.name: s for s in survey_plugins()}
    assert status["cuda"].error is None
    assert status["cuda"].available == torch.cuda.is_available()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_op_table_is_complete_even_without_a_gpu() -> None:
    # Constructing the platform imports the kernel modules; it must register every op.
    from tessera.hal.cuda import CudaPlatform

    platform = CudaPlatform()
    assert platform.registered_ops() == sorted(OP_NAMES)


def test_capture_batch_sizes() -> None:
    assert capture_batch_sizes(1) == [1]
    assert capture_batch_sizes(6) == [1, 2, 4, 6]
    assert capture_batch_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    sizes = capture_batch_sizes(256)
    assert sizes[:4] == [1, 2, 4, 8] and sizes[-1] == 256
    assert sizes == sorted(set(sizes))
    assert all(b - a in (8, 16) for a, b in zip(sizes[3:], sizes[4:], strict=False))
    assert capture_batch_sizes(100)[-2:] == [96, 100]


def test_padded_batch_size() -> None:
    sizes = capture_batch_sizes(64)
    assert padded_batch_size(1, sizes) == 1
    assert padded_batch_size(3, sizes) == 4
    assert padded_batch_size(9, sizes) == 16
    assert padded_batch_size(64, sizes) == 64
    assert padded_batch_size(65, sizes) is None
