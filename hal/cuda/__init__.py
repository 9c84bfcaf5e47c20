"""The `cuda` HAL plugin: Triton kernels, CUDA graphs, NCCL (see platform.py)."""

from tessera.hal.cuda.platform import CudaPlatform

__all__ = ["CudaPlatform"]
