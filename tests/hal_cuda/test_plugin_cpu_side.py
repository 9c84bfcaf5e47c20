"""What the cuda plugin does on a machine without a GPU: import cleanly, say it is
unavailable, and keep its copies, events and profiler ranges safe to call."""

from __future__ import annotations

import pytest
import torch

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


def test_copies_leave_host_tensors_alone_and_ranges_nest() -> None:
    from tessera.hal.cuda import runtime

    host = torch.arange(4)
    assert runtime.device_to_host(host) is host
    assert torch.equal(runtime.host_to_device(host, torch.device("cpu")), host)
    if torch.cuda.is_available():  # NVTX needs the CUDA runtime
        with runtime.nvtx_range("step"), runtime.nvtx_range("forward"):
            pass
