"""hal/cuda/pdl.py's switch: what HAL_CUDA_PDL accepts, what a launch is given on and off,
and that a machine without a GPU (or the interpreter) never asks for it. The kernels' side
(no memory touched before the wait) is test_kernels_compile.py's; PDL against plain launches
on a GPU is test_kernels_gpu.py's."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")


def test_setting_accepts_on_and_off_and_refuses_the_rest() -> None:
    from tessera.hal.cuda import pdl

    assert pdl.setting(None) == pdl.setting("") == pdl.setting("1") == pdl.setting(" On ") == "on"
    assert pdl.setting("0") == pdl.setting("off") == pdl.setting("false") == "off"
    assert pdl.setting("prefetch") == "prefetch" and pdl.setting("SMALL") == "small"
    with pytest.raises(ValueError, match="HAL_CUDA_PDL='maybe'"):
        pdl.setting("maybe")


def test_launch_options_follow_the_switch() -> None:
    from tessera.hal.cuda import pdl

    both = {"USE_PDL": True, "launch_pdl": True}
    with pdl.forced(True):
        assert pdl.on()
        assert pdl.launch_options() == both
        assert pdl.gemv_launch_options(8192) == both
        with pdl.forced(False):
            assert pdl.launch_options() == pdl.gemv_launch_options(8192) == {}
            assert not pdl.on()
        with pdl.forced("prefetch"):
            assert pdl.gemv_launch_options(8192) == {**both, "PREFETCH": True, "PF_LINES": 64}
            assert pdl.launch_options() == both
        with pdl.forced("small"):
            assert pdl.gemv_launch_options(8192) == {} and pdl.launch_options() == both
        assert pdl.on()


def test_off_without_a_gpu() -> None:
    import torch

    from tessera.hal.cuda import pdl

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert not pdl.on() and pdl.launch_options() == {}


def test_prefetch_lines_cover_a_row() -> None:
    from tessera.hal.cuda import pdl

    assert pdl.prefetch_lines(8192) == 64  # a bf16 row of 4096: 64 lines of 128 bytes
    assert pdl.prefetch_lines(28672) == 256  # down's 14336: 224 lines, a power of two
    assert pdl.prefetch_lines(100) == 1


def test_the_plugin_records_the_variable() -> None:
    from tessera.hal.cuda import pdl
    from tessera.hal.cuda.platform import CudaPlatform

    assert pdl.VARIABLE in CudaPlatform.environment_variables
