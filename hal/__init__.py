"""The hardware abstraction layer: everything chip-specific sits behind one plugin.

What the rest of tessera uses (only worker processes import this package):

    from tessera.hal.registry import load_platform
    platform = load_platform(name)      # name, else TESSERA_HAL, else the best available
    platform.op("rms_norm")(x, w, eps)  # the op table; names and semantics in hal/ops.py
    platform.create_kv_arena(...)       # KVArena, hal/platform.py
    platform.create_graph_runner()      # None when capabilities.graph_capture is False
    platform.create_communicator(rank, world_size, init_method, loopback=False)
    platform.linear_kernel("int4")      # a quantized linear (hal/quant, hal/base.py)
    from tessera.hal.rope import cos_sin_cache

Modules: platform.py / ops.py (the contract), base.py (OpTablePlatform: op dict plus declared
reference fallbacks), registry.py (discovery and selection), reference.py (the oracle ops),
local_comm.py (single-rank and loopback communicators), quant/ (the quantization schemes:
layouts, definition, quantizers), conformance_quant.py (their conformance cases),
dist_comm.py (the torch.distributed collectives gloo and NCCL share), rope.py, torch_library.py (the ops as
torch.library custom ops), conformance.py (the suite every plugin passes), doctor.py
(`tessera doctor`), cpu/ (the reference plugin), cuda/ (Triton kernels, CUDA graphs, NCCL).
Importing this package imports nothing heavy.
"""
