"""Where a step's time goes on the GPU (docs/performance.md), through the worker's real path
(ModelRunner.launch / finish, its graphs), Llama-3-8B shape, bf16, random weights.

    python3 tests/hal_cuda/gpu_step_profile.py OUT_DIR [--config PATH] [--only=PART ...]
                                   [--quantization fp8|int8|int4] [--kv-cache-dtype fp8_e4m3]
    python3 tests/hal_cuda/gpu_step_profile.py OUT_DIR --cpu   # dry run of the logic: cpu
                                                               # plugin, tiny model, stand-in
                                                               # graph runner

Parts (all by default):
  steps         the compositions of the first profile (decode-only; 32 decodes + a chunk of
                1..2048 tokens; prefill-only), each on the default path (graphs) and eagerly:
                wall, host launch and GPU time per step. The GPU time is measured with the
                device held back by a spin kernel while the host queues the step, so it is
                the device's own time without launch gaps; host_bound says launch > GPU.
  equality      graph replay against eager forwards of the same padded inputs (must be bit
                for bit) and of the unpadded step (close; greedy tokens agree).
  host_ops      host microseconds per eager op call (what a step beyond the graphs pays).
  sweep_extend  the extend-attention tunables (BLOCK_M, BLOCK_N, warps, stages): TFLOP/s.
  sweep_decode  the decode-attention tunables (BLOCK_N, warps, stages): GB/s of KV read.
  ttft          a 512-token prefill as the pipelined worker runs it (the next decode step is
                launched before the prefill's token is read): B1's TTFT inside the worker.
  traces        torch.profiler tables and chrome traces of one c=32-like step and others.
Writes OUT_DIR/step_profile.json, OUT_DIR/prof_*.txt and OUT_DIR/trace_*.json.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tessera.bus.messages import ForwardBatch
from tessera.config import EngineConfig
from tessera.worker_proc.forward_inputs import ForwardInputs, build_forward_inputs
from tessera.worker_proc.model_runner import ModelRunner

ROOT = Path(__file__).resolve().parents[2]
CTX = 600  # decode context of every running request, as in the first profile
PARTS = ("steps", "equality", "host_ops", "sweep_extend", "sweep_decode", "ttft", "traces")
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "intermediate_size": 128, "vocab_size": 256, "hidden_act": "silu",
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 4096,
        "tie_word_embeddings": False, "attention_bias": False}


def log(*args: Any) -> None:
    print(time.strftime("%H:%M:%S"), *args, flush=True)


def cpu_capturing_platform() -> Any:
    """The cpu plugin with a stand-in graph runner that reruns the captured callable on the
    static buffers: the dry run exercises the graph code paths."""
    from tessera.hal.cpu import CpuPlatform

    class Rerun:
        def __init__(self) -> None:
            self.fns: dict[Any, Callable[[], torch.Tensor]] = {}
            self.outputs: dict[Any, torch.Tensor] = {}

        def capture(self, key: Any, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
            self.fns[key] = fn
            self.outputs[key] = fn()
            return self.outputs[key]

        def replay(self, key: Any) -> None:
            with torch.inference_mode():
                self.outputs[key].copy_(self.fns[key]())

    class CapturingCpu(CpuPlatform):
        capabilities = dataclasses.replace(CpuPlatform.capabilities, graph_capture=True,
                                           max_capture_batch=256)

        def create_graph_runner(self) -> Any:
            return Rerun()

    return CapturingCpu()


class Harness:
    """One ModelRunner, a page table whose row r owns 1536 distinct slots, ForwardBatches."""

    def __init__(self, config_path: str, gpu: bool, graph_max_tokens: int,
                 quantization: str = "none", kv_cache_dtype: str = "auto") -> None:
        self.gpu = gpu
        self.cfg = EngineConfig(model=config_path, load_format="dummy",
                                hal="cuda" if gpu else "cpu", max_running_requests=256,
                                max_total_tokens=400_000 if gpu else 40_000,
                                context_length=4096, graph_max_tokens=graph_max_tokens,
                                dtype="bfloat16" if gpu else "float32",
                                quantization=quantization, kv_cache_dtype=kv_cache_dtype)
        if gpu:
            from tessera.hal.registry import load_platform

            platform = load_platform("cuda")
        else:
            platform = cpu_capturing_platform()
        start = time.perf_counter()
        self.runner = ModelRunner(self.cfg, 0, platform)
        self.ready_s = time.perf_counter() - start
        r, w = self.cfg.max_running_requests, self.runner.max_context_len
        self.rtt = np.zeros((r, w), dtype=np.int32)
        page = self.cfg.page_size
        usable = self.runner.kv_plan.num_slots - page
        for row in range(r):
            base = page + row * 1536
            self.rtt[row, :1536] = (np.arange(base, base + 1536) - page) % usable + page
        self.step_no = 0
        self.vocab = self.runner.model_config.vocab_size
        self.paths: dict[str, int] = {"decode_graph": 0, "mixed_graph": 0}
        for attr, key in (("graphs", "decode_graph"), ("mixed_graphs", "mixed_graph")):
            graphs = getattr(self.runner, attr)
            if graphs is not None:
                graphs.run = self._counting(graphs.run, key)

    def _counting(self, run: Callable[[ForwardInputs], torch.Tensor],
                  key: str) -> Callable[[ForwardInputs], torch.Tensor]:
        def counted(inputs: ForwardInputs) -> torch.Tensor:
            self.paths[key] += 1
            return run(inputs)
        return counted

    def sync(self) -> None:
        if self.gpu:
            torch.cuda.synchronize()

    def batch(self, entries: list[tuple[int, int, int]], last_sampled: bool = False
              ) -> ForwardBatch:
        """entries: (row, extend_len, seq_len after the step)."""
        self.step_no += 1
        b = len(entries)
        ext = np.array([e[1] for e in entries], np.int32)
        ids = np.random.randint(0, min(1000, self.vocab), int(ext.sum())).astype(np.int32)
        if last_sampled:
            ids[:] = -1
        f32 = lambda v: np.full(b, v, np.float32)  # noqa: E731
        return ForwardBatch(
            step=self.step_no, rows=np.array([e[0] for e in entries], np.int32),
            seq_lens=np.array([e[2] for e in entries], np.int32), extend_lens=ext,
            input_ids=ids, sample=np.ones(b, np.uint8), output_lens=np.zeros(b, np.int32),
            temperature=f32(0.0), top_p=f32(1.0), top_k=np.zeros(b, np.int32), min_p=f32(0.0),
            repetition_penalty=f32(1.0), frequency_penalty=f32(0.0),
            presence_penalty=f32(0.0), seeds=np.full(b, -1, np.int64),
            logprobs=np.full(b, -1, np.int32), is_decode=bool((ext == 1).all()))

    def inputs(self, batch: ForwardBatch) -> ForwardInputs:
        return build_forward_inputs(batch, self.rtt, self.runner.platform, self.runner.device)

    @contextlib.contextmanager
    def eager(self) -> Iterator[None]:
        """Every step eagerly (no graph of either kind)."""
        saved = self.runner.graphs, self.runner.mixed_graphs
        self.runner.graphs = self.runner.mixed_graphs = None
        try:
            yield
        finally:
            self.runner.graphs, self.runner.mixed_graphs = saved

    def timed(self, make: Callable[[], ForwardBatch], reps: int = 12) -> dict[str, Any]:
        reps = reps if self.gpu else 1  # the dry run checks the logic, not the time
        for _ in range(2):
            self.runner.step(make(), self.rtt)
        self.sync()
        before = dict(self.paths)
        walls, launches, gpus = [], [], []
        for _ in range(reps):
            bt = make()
            self.sync()
            start = time.perf_counter()
            pending = self.runner.launch(bt, self.rtt)
            launches.append((time.perf_counter() - start) * 1e3)
            self.runner.finish(pending)
            walls.append((time.perf_counter() - start) * 1e3)
        if self.gpu:
            for _ in range(reps):
                gpus.append(self.gpu_ms(make()))
        path = [k for k in self.paths if self.paths[k] > before[k]]
        out: dict[str, Any] = {
            "wall_ms": round(statistics.median(walls), 3),
            "launch_host_ms": round(statistics.median(launches), 3),
            "path": path[0] if path else "eager",
        }
        if gpus:
            out["gpu_ms"] = round(statistics.median(gpus), 3)
            out["host_bound"] = out["launch_host_ms"] > out["gpu_ms"]
        return out

    _cycles_per_ms: float | None = None

    def spin_cycles_per_ms(self) -> float:
        """torch.cuda._sleep's cycles per millisecond, measured once."""
        if self._cycles_per_ms is None:
            start, end = (torch.cuda.Event(enable_timing=True),
                          torch.cuda.Event(enable_timing=True))
            cycles = 20_000_000
            torch.cuda._sleep(cycles // 10)  # warm
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            self.sync()
            self._cycles_per_ms = cycles / max(start.elapsed_time(end), 1e-3)
        return self._cycles_per_ms

    def gpu_ms(self, bt: ForwardBatch, hold_ms: float = 60.0) -> float:
        """The step's device time: a spin kernel holds the device while the host queues the
        whole step, so the step's kernels then run back to back."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.sync()
        torch.cuda._sleep(int(hold_ms * self.spin_cycles_per_ms()))
        start.record()
        launched = time.perf_counter()
        pending = self.runner.launch(bt, self.rtt)
        end.record()
        host_ms = (time.perf_counter() - launched) * 1e3
        self.runner.finish(pending)
        if host_ms > hold_ms * 0.8:
            log(f"  (launch took {host_ms:.1f} ms: the hold may not have covered it)")
        return float(start.elapsed_time(end))


def decode_entries(n: int) -> list[tuple[int, int, int]]:
    return [(r, 1, CTX) for r in range(n)]


# --- parts ---------------------------------------------------------------------------------------
def part_steps(h: Harness) -> dict[str, Any]:
    comps: dict[str, Callable[[], ForwardBatch]] = {}
    for n in (1, 32, 128, 256):  # 256: B2's decode steps
        comps[f"decode_bs{n}"] = lambda n=n: h.batch(decode_entries(n))
    for p in (1, 16, 128, 256, 512, 2048):
        comps[f"mixed_32dec_plus_{p}"] = lambda p=p: h.batch(decode_entries(32) + [(200, p, p)])
    comps["mixed_128dec_plus_512"] = lambda: h.batch(decode_entries(128) + [(200, 512, 512)])
    for p in (128, 512, 2048):
        comps[f"prefill_only_{p}"] = lambda p=p: h.batch([(200, p, p)])
    comps["prefill_4x512"] = lambda: h.batch([(200 + i, 512, 512) for i in range(4)])
    results: dict[str, Any] = {}
    for name, make in comps.items():
        results[name] = h.timed(make)
        with h.eager():
            results[f"{name}_eager"] = h.timed(make)
        for key in (name, f"{name}_eager"):
            v = results[key]
            gpu = f"gpu {v['gpu_ms']:7.2f} ms" if "gpu_ms" in v else ""
            log(f"{key:30s} {v['path']:13s} wall {v['wall_ms']:7.2f} ms  host launch "
                f"{v['launch_host_ms']:7.2f} ms  {gpu}")
    return results


def part_equality(h: Harness) -> dict[str, Any]:
    """Graph replay vs eager on the same padded static inputs (bitwise) and vs the eager
    unpadded step (max |diff| of the logits, greedy agreement)."""
    r = h.runner
    r.kv.storage.normal_(0.0, 0.5)  # non-trivial cached prefixes (page 0 stays finite)
    comps = {
        "32dec_plus_256": decode_entries(32) + [(200, 256, 256)],
        "32dec_plus_16": decode_entries(32) + [(200, 16, 16)],
        "prefill_512": [(200, 512, 512)],
        "128dec_plus_512": decode_entries(128) + [(200, 512, 512)],
        "4_chunks_after_prefixes": [(200 + i, 200, 300 + 100 * i) for i in range(4)],
        "5dec_plus_1000": decode_entries(5) + [(200, 1000, 1400)],
        "decode_bs37": decode_entries(37),
    }
    out: dict[str, Any] = {}
    with torch.inference_mode():
        for name, entries in comps.items():
            inputs = h.inputs(h.batch(entries))
            graphs = r.graphs if inputs.is_decode else r.mixed_graphs
            if graphs is None or not graphs.can_run(inputs):
                out[name] = {"skipped": "no graph holds this step"}
                continue
            sampled = int(inputs.logits_indices.shape[0])
            replayed = graphs.run(inputs).clone()
            h.sync()
            # eagerly, what the graph computed: the padded static inputs of its size
            if inputs.is_decode:
                size = graphs.padded_size(int(inputs.seq_lens.shape[0]))
                same_inputs = r.model(graphs._static(size), r.kv)[:sampled]
            else:
                size = graphs.bucket_for(inputs.num_tokens)
                hidden, residual = r.model.hidden(graphs._static(size), r.kv)
                t = inputs.num_tokens
                same_inputs = r.model.logits(
                    hidden[:t], residual[:t] if residual is not None else None, inputs)
            unpadded = r.model(inputs, r.kv)
            out[name] = {
                "graph_size": size,
                "bitwise_equal_to_eager_padded": bool(torch.equal(replayed, same_inputs)),
                "max_abs_diff_vs_eager_padded": float((replayed - same_inputs).abs().max()),
                "max_abs_diff_vs_eager_unpadded": float((replayed - unpadded).abs().max()),
                "greedy_agree_vs_eager_unpadded": float(
                    (replayed.argmax(-1) == unpadded.argmax(-1)).float().mean()),
            }
            log(f"equality {name:26s} {out[name]}")
    return out


def _op_calls(h: Harness, tokens: int) -> dict[str, Callable[[], Any]]:
    """One eager call of each op at a step of `tokens` tokens (32 of them decodes)."""
    r = h.runner
    op = r.platform.op
    dev, dt = r.device, r.dtype
    mc = r.model_config
    hidden, heads, kv_heads, dim = mc.hidden_size, mc.num_heads, mc.num_kv_heads, mc.head_dim
    x = torch.randn((tokens, hidden), device=dev, dtype=dt)
    w_qkv = torch.randn(((heads + 2 * kv_heads) * dim, hidden), device=dev, dtype=dt) * 0.02
    norm_w = torch.ones(hidden, device=dev, dtype=dt)
    q = torch.randn((tokens, heads, dim), device=dev, dtype=dt)
    k = torch.randn((tokens, kv_heads, dim), device=dev, dtype=dt)
    pos = torch.arange(tokens, device=dev)
    slots = torch.arange(16, 16 + tokens, device=dev)
    cos_sin = torch.randn((4096, dim), device=dev, dtype=dt)
    kc, vc = r.kv.k[0], r.kv.v[0]
    lens = [1] * 32 + [tokens - 32] if tokens > 32 else [1] * tokens
    ext = torch.tensor(lens, dtype=torch.int32, device=dev)
    b = len(lens)
    seq = ext + CTX
    qo = torch.zeros(b + 1, dtype=torch.int32, device=dev)
    qo[1:] = ext.cumsum(0)
    rtt = torch.from_numpy(h.rtt[:b, :CTX + tokens]).to(dev)
    gate_up = torch.randn((tokens, 2 * mc.intermediate_size), device=dev, dtype=dt)
    return {
        "linear_qkv": lambda: op("linear")(x, w_qkv, None),
        "rms_norm": lambda: op("rms_norm")(x, norm_w, 1e-5),
        "fused_add_rms_norm": lambda: op("fused_add_rms_norm")(x, x, norm_w, 1e-5),
        "rotary_embedding": lambda: op("rotary_embedding")(pos, q, k, cos_sin),
        "store_kv": lambda: op("store_kv")(kc, vc, k, k, slots),
        "silu_and_mul": lambda: op("silu_and_mul")(gate_up),
        "attention_extend": lambda: op("attention_extend")(q, kc, vc, rtt, seq, ext, qo,
                                                           dim ** -0.5),
        "torch_empty": lambda: torch.empty((tokens, hidden), device=dev, dtype=dt),
    }


def part_host_ops(h: Harness) -> dict[str, Any]:
    """Host microseconds per eager call of each op (queued without waiting; the device runs
    behind): what an eager step pays per launch."""
    out: dict[str, Any] = {}
    for tokens in (32, 288, 1024):
        row: dict[str, float] = {}
        for name, fn in _op_calls(h, tokens).items():
            with torch.inference_mode():
                for _ in range(3):
                    fn()
                h.sync()
                n = 100
                start = time.perf_counter()
                for _ in range(n):
                    fn()
                row[name] = round((time.perf_counter() - start) / n * 1e6, 1)
                h.sync()
        out[f"tokens_{tokens}"] = row
        log(f"host us per call, {tokens} tokens: {row}")
    return out


def _graph_time_us(fn: Callable[[], Any], reps: int = 10, iters: int = 10) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    del graph
    return start.elapsed_time(end) * 1e3 / (iters * reps)


def _paged(lens: list[int], extends: list[int], kv_heads: int, heads: int, dim: int
           ) -> dict[str, torch.Tensor]:
    dev = torch.device("cuda")
    width = max(lens)
    slots = 16 + sum(lens)
    rtt = torch.zeros((len(lens), width), dtype=torch.int32, device=dev)
    at = 16
    for i, n in enumerate(lens):
        rtt[i, :n] = torch.randperm(n, device=dev).int() + at
        at += n
    ext = torch.tensor(extends, dtype=torch.int32, device=dev)
    qo = torch.zeros(len(lens) + 1, dtype=torch.int32, device=dev)
    qo[1:] = ext.cumsum(0)
    return {
        "q": torch.randn((sum(extends), heads, dim), device=dev, dtype=torch.bfloat16),
        "k_cache": torch.randn((slots, kv_heads, dim), device=dev, dtype=torch.bfloat16),
        "v_cache": torch.randn((slots, kv_heads, dim), device=dev, dtype=torch.bfloat16),
        "req_to_token": rtt, "seq_lens": torch.tensor(lens, dtype=torch.int32, device=dev),
        "extend_lens": ext, "qo_indptr": qo,
    }


def part_sweep_extend(h: Harness) -> dict[str, Any]:
    from tessera.hal.cuda import extend_attention as ea

    mc = h.runner.model_config
    heads, kv_heads, dim = mc.num_heads, mc.num_kv_heads, mc.head_dim
    shapes = {"prefill_512": ([512], [512]), "prefill_2048": ([2048], [2048]),
              "prefill_4096": ([4096], [4096]), "chunk_512_after_3584": ([4096], [512]),
              "32dec_ctx600_plus_256": ([CTX] * 32 + [256], [1] * 32 + [256])}
    configs = [(64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 8, 3), (128, 64, 4, 3),
               (128, 128, 8, 3), (64, 128, 4, 3), (128, 32, 4, 3), (128, 64, 8, 2),
               (64, 32, 4, 3), (32, 64, 4, 2)]
    saved = (ea.BLOCK_M, ea.BLOCK_N, ea.NUM_WARPS, ea.NUM_STAGES)
    out: dict[str, Any] = {"configs": [list(c) for c in configs], "default": list(saved)}
    try:
        for name, (lens, extends) in shapes.items():
            c = _paged(lens, extends, kv_heads, heads, dim)
            flops = 0.0
            for n, e in zip(lens, extends, strict=True):
                if e > 1:
                    prefix = n - e
                    flops += 4.0 * dim * heads * sum(prefix + i + 1 for i in range(e))
            row: dict[str, float] = {}
            for cfg in configs:
                ea.BLOCK_M, ea.BLOCK_N, ea.NUM_WARPS, ea.NUM_STAGES = cfg
                try:
                    us = _graph_time_us(lambda c=c: ea.attention_extend(
                        c["q"], c["k_cache"], c["v_cache"], c["req_to_token"], c["seq_lens"],
                        c["extend_lens"], c["qo_indptr"], dim ** -0.5))
                except Exception as exc:  # noqa: BLE001 - a config may not fit the chip
                    log(f"  extend {name} {cfg}: {type(exc).__name__}: {exc}")
                    continue
                row[str(list(cfg))] = round(us, 1)
            best = min(row, key=row.__getitem__) if row else None
            out[name] = {"us": row, "best": best, "flops": flops,
                         "best_tflops": round(flops / row[best] / 1e6, 1) if best else None}
            log(f"extend {name:24s} best {best} {row.get(best or '', 0)} us "
                f"({out[name]['best_tflops']} TFLOP/s); default {row.get(str(list(saved)))}")
    finally:
        ea.BLOCK_M, ea.BLOCK_N, ea.NUM_WARPS, ea.NUM_STAGES = saved
    return out


def part_sweep_decode(h: Harness) -> dict[str, Any]:
    from tessera.hal.cuda import decode_attention as da

    mc = h.runner.model_config
    heads, kv_heads, dim = mc.num_heads, mc.num_kv_heads, mc.head_dim
    shapes = {"b1_ctx4096": (1, 4096), "b1_ctx32768": (1, 32768), "b32_ctx600": (32, CTX),
              "b32_ctx4096": (32, 4096), "b128_ctx600": (128, CTX), "b128_ctx2048": (128, 2048),
              "b256_ctx1024": (256, 1024)}
    configs = [(bn, w, s) for bn in (32, 64, 128) for w in (4, 8) for s in (2, 3, 4)]
    saved = (da.BLOCK_N, da.NUM_WARPS, da.NUM_STAGES)
    # --kv-cache-dtype fp8_e4m3: the caches in e4m3 (the kernel reads them as q's dtype; the
    # scales, folded in by the caller, are 1 here), the bandwidth on their bytes
    fp8 = h.cfg.kv_cache_dtype.startswith("fp8")
    out: dict[str, Any] = {"default": list(saved), "kv_cache_dtype": h.cfg.kv_cache_dtype}
    try:
        for name, (b, ctx) in shapes.items():
            c = _paged([ctx] * b, [1] * b, kv_heads, heads, dim)
            if fp8:
                c["k_cache"] = c["k_cache"].to(torch.float8_e4m3fn)
                c["v_cache"] = c["v_cache"].to(torch.float8_e4m3fn)
            kv_bytes = 2.0 * b * ctx * kv_heads * dim * c["k_cache"].element_size()
            row: dict[str, float] = {}
            for cfg in configs:
                da.BLOCK_N, da.NUM_WARPS, da.NUM_STAGES = cfg
                try:
                    us = _graph_time_us(lambda c=c: da.attention_decode(
                        c["q"], c["k_cache"], c["v_cache"], c["req_to_token"], c["seq_lens"],
                        dim ** -0.5))
                except Exception as exc:  # noqa: BLE001
                    log(f"  decode {name} {cfg}: {type(exc).__name__}: {exc}")
                    continue
                row[str(list(cfg))] = round(us, 1)
            best = min(row, key=row.__getitem__)
            default = row.get(str(list(saved)))
            # The split count at the default tunables (the heuristic's choice beside others).
            da.BLOCK_N, da.NUM_WARPS, da.NUM_STAGES = saved
            chosen = da.num_splits(b, kv_heads, c["q"].device)
            by_splits: dict[int, float] = {}
            for n_split in sorted({1, 2, 4, 8, 16, 32, chosen}):
                by_splits[n_split] = round(_graph_time_us(lambda c=c, n=n_split: da.attention_decode(
                    c["q"], c["k_cache"], c["v_cache"], c["req_to_token"], c["seq_lens"],
                    dim ** -0.5, splits=n)), 1)
            out[name] = {"us": row, "best": best, "kv_bytes": kv_bytes,
                         "best_gbps": round(kv_bytes / row[best] / 1e3, 0),
                         "default_gbps": round(kv_bytes / default / 1e3, 0) if default else None,
                         "splits_chosen": chosen, "us_by_splits": by_splits}
            log(f"decode {name:14s} best {best} {row[best]} us ({out[name]['best_gbps']} GB/s); "
                f"default {default} us ({out[name]['default_gbps']} GB/s); splits {chosen} "
                f"chosen, by splits {by_splits}")
    finally:
        da.BLOCK_N, da.NUM_WARPS, da.NUM_STAGES = saved
    return out


def part_ttft(h: Harness) -> dict[str, Any]:
    """A 512-token prompt as the pipelined worker runs it: launch the prefill, launch the next
    step (this request's first decode, input id -1) behind it, then wait for the prefill's
    token. Time from the prefill's launch to its token on the host."""
    r = h.runner
    out: dict[str, Any] = {}

    def once() -> float:
        row = 210
        h.sync()
        start = time.perf_counter()
        first = r.launch(h.batch([(row, 512, 512)]), h.rtt)
        nxt = r.launch(h.batch([(row, 1, 513)], last_sampled=True), h.rtt)
        r.finish(first)
        ttft = (time.perf_counter() - start) * 1e3
        r.finish(nxt)
        return ttft

    for label, ctx in (("graphs", contextlib.nullcontext()), ("eager", h.eager())):
        with ctx:
            for _ in range(2):
                once()
            runs = [once() for _ in range(10)]
        out[f"worker_ttft_512_{label}_ms"] = round(statistics.median(runs), 3)
        log(f"worker TTFT of a 512-token prompt ({label}): {out[f'worker_ttft_512_{label}_ms']} ms")
    return out


def part_traces(h: Harness, out_dir: Path, only: list[str] | None = None) -> dict[str, Any]:
    """Chrome traces (and kernel tables) of three steps of each composition, or of those in
    `only` (--trace NAME)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    comps = {"mixed_32dec_plus_256": lambda: h.batch(decode_entries(32) + [(200, 256, 256)]),
             "prefill_only_512": lambda: h.batch([(200, 512, 512)]),
             "decode_bs32": lambda: h.batch(decode_entries(32)),
             # B2's steps: a full decode batch, and a whole chunk beside running decodes
             "decode_bs256": lambda: h.batch(decode_entries(256)),
             "mixed_128dec_plus_2048": lambda: h.batch(decode_entries(128)
                                                       + [(200, 2048, 2048)]),
             # B1's step: its kernels one by one (how many launches a layer costs)
             "decode_bs1": lambda: h.batch(decode_entries(1))}
    if only:
        unknown = set(only) - set(comps)
        if unknown:
            raise ValueError(f"--trace {sorted(unknown)}: the compositions are {sorted(comps)}")
        comps = {k: v for k, v in comps.items() if k in only}
    written = []
    # The worker's own phase ranges (--profile-ranges: NVTX through the plugin) as profiler
    # ranges here, so the chrome trace shows inputs / forward / sample / copy-out per step.
    saved_phase = getattr(h.runner, "_phase", None)
    if saved_phase is not None:
        h.runner._phase = record_function
    for name, make in comps.items():
        for label, ctx in (("graph", contextlib.nullcontext()), ("eager", h.eager())):
            if name.startswith("decode_bs") and label == "eager":
                continue
            with ctx:
                h.runner.step(make(), h.rtt)
                h.sync()
                activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if h.gpu else [])
                with profile(activities=activities) as prof:
                    for i in range(3):
                        with record_function(f"step {i}: launch"):
                            pending = h.runner.launch(make(), h.rtt)
                        with record_function(f"step {i}: finish"):
                            h.runner.finish(pending)
                    h.sync()
            tag = f"{name}_{label}"
            prof.export_chrome_trace(str(out_dir / f"trace_{tag}.json"))
            table = prof.key_averages().table(
                sort_by="cuda_time_total" if h.gpu else "cpu_time_total", row_limit=25)
            (out_dir / f"prof_{tag}.txt").write_text(table)
            written.append(tag)
            log(f"trace {tag} written")
    if saved_phase is not None:
        h.runner._phase = saved_phase
    return {"written": written}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir")
    p.add_argument("--config", default=str(ROOT / "benchmarks/configs/llama3-8b.json"))
    p.add_argument("--only", action="append", choices=PARTS)
    p.add_argument("--trace", action="append", metavar="COMPOSITION",
                   help="the traces part: only these compositions (e.g. mixed_32dec_plus_256)")
    p.add_argument("--graph-max-tokens", type=int, default=EngineConfig.graph_max_tokens)
    p.add_argument("--cpu", action="store_true", help="dry run: cpu plugin, tiny model")
    p.add_argument("--quantization", default="none",
                   help="weights quantized at load (fp8, int8, int4), as the engine's flag")
    p.add_argument("--kv-cache-dtype", default="auto", help="as the engine's flag")
    args = p.parse_args(argv)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu = not args.cpu
    if gpu and not torch.cuda.is_available():
        p.error("no GPU here; --cpu runs a dry run of the logic")
    config = args.config
    parts = args.only or list(PARTS)
    if not gpu:
        config = str(out_dir / "tiny-config.json")
        Path(config).write_text(json.dumps(TINY))
        parts = [x for x in parts if x in ("steps", "equality", "ttft", "traces")]
    np.random.seed(0)
    torch.manual_seed(0)
    h = Harness(config, gpu, args.graph_max_tokens, args.quantization, args.kv_cache_dtype)
    r = h.runner
    report: dict[str, Any] = {
        "torch": torch.__version__, "config": config, "ready_s": round(h.ready_s, 1),
        "quantization": args.quantization, "kv_cache_dtype": args.kv_cache_dtype,
        "decode_graph_sizes": r.graphs.sizes if r.graphs is not None else None,
        "mixed_graph_buckets": r.mixed_graphs.buckets if r.mixed_graphs is not None else None,
    }
    if gpu:
        weights = sum(t.numel() * t.element_size() for t in r.model.parameters())
        # what the device holds beyond weights and KV: graph pools, static buffers, workspaces
        report["reserved_beyond_weights_and_kv_mib"] = round(
            (torch.cuda.memory_reserved() - weights - r.kv_plan.total_bytes) / 2**20, 1)
        report["device"] = torch.cuda.get_device_name()
        # the commit measured (the device copy's git metadata is stale: gpu_session.sh sets it)
        report["commit"] = os.environ.get("TESSERA_COMMIT")
        report["versions"] = r.platform.versions()  # type: ignore[attr-defined]
    log(f"runner ready in {h.ready_s:.1f}s: {report}")
    table: dict[str, Callable[[], Any]] = {
        "steps": lambda: part_steps(h), "equality": lambda: part_equality(h),
        "host_ops": lambda: part_host_ops(h), "sweep_extend": lambda: part_sweep_extend(h),
        "sweep_decode": lambda: part_sweep_decode(h), "ttft": lambda: part_ttft(h),
        "traces": lambda: part_traces(h, out_dir, args.trace)}
    failed = 0
    for name in parts:
        log(f"--- {name}")
        try:
            report[name] = table[name]()
        except Exception as exc:  # noqa: BLE001 - report the part and go on with the others
            import traceback

            traceback.print_exc()
            report[name] = {"error": f"{type(exc).__name__}: {exc}"}
            failed += 1
        (out_dir / "step_profile.json").write_text(json.dumps(report, indent=1))
    log(f"wrote {out_dir / 'step_profile.json'}; {failed} part(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
