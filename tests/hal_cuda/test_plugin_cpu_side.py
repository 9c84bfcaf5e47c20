"""What the cuda plugin does on a machine without a GPU: import cleanly, say it is
unavailable, and keep its copies, events and profiler ranges safe to call."""

from __future__ import annotations

import pytest
import torch

from tessera.hal.ops import FUSED_OP_NAMES, OP_NAMES

CUDA_FUSED = ("rotary_store_kv", "moe_softmax_topk")


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
    # every plain op, and the fused ops it offers (the SiLU-prologue GEMV measured slower
    # on the H200 and was removed)
    assert platform.registered_ops() == sorted(OP_NAMES + CUDA_FUSED)


@pytest.mark.skipif(torch.cuda.is_available(), reason="builds the platform without a GPU")
@pytest.mark.parametrize("value,off", [("", ()), ("rotary_store_kv", ("rotary_store_kv",)),
                                       ("all", FUSED_OP_NAMES), (" all , ", FUSED_OP_NAMES)])
def test_unfuse_switch_leaves_the_fused_ops_out(monkeypatch: pytest.MonkeyPatch, value: str,
                                               off: tuple[str, ...]) -> None:
    from tessera.hal.cuda import CudaPlatform
    from tessera.hal.cuda.platform import UNFUSE_VARIABLE

    monkeypatch.setenv(UNFUSE_VARIABLE, value)
    platform = CudaPlatform()
    for name in FUSED_OP_NAMES:
        assert (platform.fused_op(name) is None) == (name in off or name not in CUDA_FUSED)
    assert set(OP_NAMES) <= set(platform.registered_ops())  # unfused ops stay
    assert UNFUSE_VARIABLE in CudaPlatform.environment_variables  # recorded in run manifests


def test_unfuse_switch_refuses_unknown_names() -> None:
    from tessera.hal.cuda.platform import UNFUSE_VARIABLE, unfused_ops

    with pytest.raises(ValueError, match=UNFUSE_VARIABLE):
        unfused_ops("rotary_store_kv,rotary_embedding")


def test_copies_leave_host_tensors_alone_and_ranges_nest() -> None:
    from tessera.hal.cuda import runtime

    host = torch.arange(4)
    assert runtime.device_to_host(host) is host
    assert torch.equal(runtime.host_to_device(host, torch.device("cpu")), host)
    if torch.cuda.is_available():  # NVTX needs the CUDA runtime
        with runtime.nvtx_range("step"), runtime.nvtx_range("forward"):
            pass


def test_packed_copy_holds_every_tensor_as_it_was() -> None:
    """host_to_device_many's packing (the one pinned buffer a step's inputs travel in, here
    an ordinary one): every tensor comes back from the buffer with its dtype, shape and
    values, empty ones and 2-D ones included, none overlapping another."""
    from tessera.hal.cuda import runtime

    gen = torch.Generator().manual_seed(0)
    hosts = [torch.randint(-5, 10**6, (513,), generator=gen),  # int64, not a 16-byte size
             torch.randint(0, 9, (3, 17), generator=gen, dtype=torch.int32),
             torch.zeros(0, dtype=torch.int64),
             torch.randn(7, generator=gen).to(torch.bfloat16),
             torch.tensor([True, False, True]),
             torch.randn(5, generator=gen),
             torch.randint(0, 9, (8, 4), generator=gen, dtype=torch.int32).t(),  # strided
             torch.arange(3, dtype=torch.int32)]
    offsets, total = runtime.pack_offsets(hosts)
    assert all(off % 16 == 0 for off in offsets) and total % 16 == 0
    staging = torch.full((total,), 0xAB, dtype=torch.uint8)
    runtime.pack(hosts, offsets, staging)
    views = runtime.packed_views(staging.clone(), hosts, offsets)
    for h, v in zip(hosts, views, strict=True):
        assert v.dtype == h.dtype and v.shape == h.shape and torch.equal(v, h)


def test_untuned_gemv_shape_is_measured_once_outside_captures(monkeypatch) -> None:
    """The choice between cuBLAS and the one-token GEMV for a shape TUNED does not hold is
    measured once per (shape, device, bias), never inside a graph capture (cuBLAS there), and
    a tuned shape is never measured (the measurement itself runs on the GPU tests)."""
    from tessera.hal.cuda import gemv

    calls = []

    def fake_measure(x, weight, bias):
        calls.append(tuple(weight.shape))
        return gemv.CANDIDATES[1] if weight.shape[1] == 1024 else gemv.CUBLAS

    monkeypatch.setattr(gemv, "_measure", fake_measure)
    monkeypatch.setattr(gemv, "_measured", {})
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    x = torch.zeros(1, 1024)
    # Llama-3-8B's o and down at --tp-size 4
    o_tp4, down_tp4 = torch.zeros(4096, 1024), torch.zeros(4096, 3584)
    capturing[0] = True
    assert gemv._config(x, o_tp4, None) is None  # first seen in a capture: cuBLAS, unmeasured
    assert calls == []
    capturing[0] = False
    assert gemv._config(x, o_tp4, None) == gemv.CANDIDATES[1]
    assert gemv._config(x, o_tp4, None) == gemv.CANDIDATES[1]
    assert gemv._config(torch.zeros(1, 3584), down_tp4, None) is None  # cuBLAS won
    capturing[0] = True
    assert gemv._config(x, o_tp4, None) == gemv.CANDIDATES[1]  # measured before: kept
    assert calls == [(4096, 1024), (4096, 3584)]
    assert gemv._config(torch.zeros(1, 4096), torch.zeros(6144, 4096), None) == \
        gemv.TUNED[(6144, 4096)]
    assert len(calls) == 2
