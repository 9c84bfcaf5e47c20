"""The cuda plugin's GPU run (issue 8): correctness against transformers, graphs vs eager,
decode-attention micro-benchmark and a B1 smoke figure. Writes JSON files into OUT_DIR.

    python3 tests/hal_cuda/gpu_run.py OUT_DIR            # on the GPU machine
    python3 tests/hal_cuda/gpu_run.py OUT_DIR --cpu      # dry run of the driver logic: cpu
                                                         # plugin, tiny config, fp32, no graphs

Not a pytest module: it needs a GPU, minutes, and 16 GB for the 32-layer B1 model.
The engine here is a minimal stand-in for the scheduler (pages of 16, a request-to-token
table, chunked prefill, a shared prefix) driving the worker's real model code.
"""

from __future__ import annotations

import json
import math
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tessera.formats.config import ModelConfig
from tessera.formats.layout import hf_tensor_shapes
from tessera.worker_proc.forward_inputs import ForwardInputs
from tessera.worker_proc.models.llama import LlamaForCausalLM

ROOT = Path(__file__).resolve().parents[2]
PAGE = 16
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "intermediate_size": 128, "vocab_size": 256, "hidden_act": "silu",
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 2048,
        "tie_word_embeddings": False, "attention_bias": False}


def log(*args: Any) -> None:
    print(time.strftime("%H:%M:%S"), *args, flush=True)


# --- a minimal engine: page table, ForwardInputs, chunked prefill, shared prefix ----------------
class MiniEngine:
    def __init__(self, model: Callable[[ForwardInputs], torch.Tensor], device: torch.device,
                 rows: int, width: int) -> None:
        self.model, self.device, self.width = model, device, width
        self.rtt = torch.zeros((rows, width), dtype=torch.int32)
        self.next_page = 1  # page 0 is the padding page

    def alloc(self, row: int, start: int, end: int) -> None:
        for p in range(start // PAGE, math.ceil(end / PAGE)):
            if p * PAGE >= start:
                self.rtt[row, p * PAGE:(p + 1) * PAGE] = torch.arange(PAGE) + self.next_page * PAGE
                self.next_page += 1

    def inputs(self, entries: list[tuple[int, list[int], int, bool]]) -> ForwardInputs:
        """entries: (row, new token ids, tokens already cached, sample?)."""
        ids, rows, pos, lens, ext, sample = [], [], [], [], [], []
        for row, toks, start, smp in entries:
            ids += toks
            rows += [row] * len(toks)
            pos += list(range(start, start + len(toks)))
            lens.append(start + len(toks))
            ext.append(len(toks))
            sample.append(smp)
        indptr = torch.zeros(len(entries) + 1, dtype=torch.int64)
        indptr[1:] = torch.tensor(ext).cumsum(0)
        row_t, pos_t = torch.tensor(rows), torch.tensor(pos)
        table = self.rtt[[e[0] for e in entries], :max(lens)]
        d = self.device
        return ForwardInputs(
            input_ids=torch.tensor(ids, device=d), token_rows=row_t.to(d),
            positions=pos_t.to(d), out_slots=self.rtt[row_t, pos_t].long().to(d),
            req_to_token=table.contiguous().to(d),
            seq_lens=torch.tensor(lens, dtype=torch.int32, device=d),
            extend_lens=torch.tensor(ext, dtype=torch.int32, device=d),
            qo_indptr=indptr.int().to(d),
            logits_indices=(indptr[1:] - 1)[torch.tensor(sample)].to(d),
            is_decode=all(x == 1 for x in ext))


def generate(engine: MiniEngine, prompts: list[list[int]], shared: tuple[int, int, int],
             new_tokens: int, chunk: int,
             decode: Callable[[ForwardInputs], torch.Tensor] | None = None) -> list[list[int]]:
    """Greedy generation. Requests 0..n-2 prefill in chunks of `chunk` tokens per step (mixed
    batches); the last request reuses the first `shared[2]` cached tokens of request
    shared[0] (its prompt begins with that prompt's tokens) and extends only the rest."""
    n = len(prompts)
    src, dst, reuse = shared
    out: list[list[int]] = [[] for _ in prompts]
    done = [0] * n
    for r in range(n - 1):
        engine.alloc(r, 0, len(prompts[r]) + new_tokens)
    while any(done[r] < len(prompts[r]) for r in range(n - 1)):
        budget, entries = chunk, []
        for r in range(n - 1):
            take = min(len(prompts[r]) - done[r], budget)
            if take <= 0:
                continue
            entries.append((r, prompts[r][done[r]:done[r] + take], done[r],
                            done[r] + take == len(prompts[r])))
            budget -= take
            done[r] += take
        logits = engine.model(engine.inputs(entries))
        for (r, _, _, smp), tok in zip([e for e in entries if e[3]],
                                       logits.argmax(-1).tolist(), strict=True):
            assert smp
            out[r].append(tok)
    engine.rtt[dst, :reuse] = engine.rtt[src, :reuse]
    engine.alloc(dst, reuse, len(prompts[dst]) + new_tokens)
    logits = engine.model(engine.inputs([(dst, prompts[dst][reuse:], reuse, True)]))
    out[dst].append(int(logits.argmax(-1)[0]))
    run = decode or engine.model
    for _ in range(new_tokens - 1):
        entries = [(r, [out[r][-1]], len(prompts[r]) + len(out[r]) - 1, True) for r in range(n)]
        logits = run(engine.inputs(entries))
        for r, tok in enumerate(logits.argmax(-1).tolist()):
            out[r].append(tok)
    return out


def hf_greedy(hf: Any, prompt: list[int], new_tokens: int, device: torch.device
              ) -> tuple[list[int], list[float]]:
    """Greedy tokens of transformers, and the top-1 minus top-2 logit margin of each step."""
    toks, margins = [], []
    out = hf(torch.tensor([prompt], device=device), use_cache=True)
    for _ in range(new_tokens):
        last = out.logits[0, -1].float()
        top = last.topk(2).values
        margins.append(float(top[0] - top[1]))
        tok = int(last.argmax())
        toks.append(tok)
        out = hf(torch.tensor([[tok]], device=device), past_key_values=out.past_key_values,
                 use_cache=True)
    return toks, margins


def build_pair(cfg: dict[str, Any], platform: Any, dtype: torch.dtype, device: torch.device,
               max_positions: int) -> tuple[Any, LlamaForCausalLM]:
    """transformers' Llama with its own random init, and tessera's model on the same weights."""
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM as HFLlama

    hf_cfg = LlamaConfig(**{k: v for k, v in cfg.items()
                            if k not in ("architectures", "torch_dtype")})
    hf_cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        hf = HFLlama(hf_cfg)
    # Keep the rotary frequencies in fp32, as loading a bf16 checkpoint does: `.to(bf16)`
    # would round the inv_freq buffers too, and angles pos * inv_freq then drift by up to
    # pos * 2^-9 radians (transformers-bf16 and an fp32 copy made from it would share that
    # error and both disagree with any exact rotary embedding on long prompts).
    freqs = {name: buf.clone() for name, buf in hf.named_buffers() if name.endswith("inv_freq")}
    hf = hf.to(dtype).eval()
    for name, buf in freqs.items():
        owner, attr = name.rsplit(".", 1)
        setattr(hf.get_submodule(owner), attr, buf)
    mc = ModelConfig.from_hf_dict(cfg)
    model = LlamaForCausalLM(mc, platform, dtype=dtype, device=device,
                             max_positions=max_positions)
    state = hf.state_dict()
    model.load_weights((name, state[name]) for name in hf_tensor_shapes(mc))
    return hf, model


def check_against_hf(cfg: dict[str, Any], platform: Any, dtype: torch.dtype,
                     device: torch.device, graphs_runner: Any | None, new_tokens: int,
                     lengths: list[int], chunk: int) -> dict[str, Any]:
    from tessera.worker_proc.graph_decode import DecodeGraphs

    hf, model = build_pair(cfg, platform, dtype, device, max_positions=4096)
    kv = platform.create_kv_arena(len(model.layers), 4096 * 2, model.tp.num_kv_heads,
                                  cfg["head_dim"], dtype)
    gen = torch.Generator().manual_seed(1)
    vocab = cfg["vocab_size"]
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]
    src = len(prompts) - 1
    reuse = (len(prompts[src]) * 2 // 3) // PAGE * PAGE
    prompts.append(prompts[src][:reuse + 5] + torch.randint(0, vocab, (40,),
                                                            generator=gen).tolist())
    shared = (src, len(prompts) - 1, reuse)

    def fwd(inp: ForwardInputs) -> torch.Tensor:
        with torch.inference_mode():
            return model(inp, kv)

    result: dict[str, Any] = {"dtype": str(dtype), "prompt_lens": [len(p) for p in prompts],
                              "shared_prefix_tokens": reuse, "prefill_chunk": chunk,
                              "new_tokens": new_tokens}
    with torch.inference_mode():
        ref = [hf_greedy(hf, p, new_tokens, device) for p in prompts]
    result["hf_tokens"] = [r[0] for r in ref]
    eager = generate(MiniEngine(fwd, device, len(prompts), 4096), prompts, shared, new_tokens,
                     chunk)
    result["eager_tokens"] = eager
    result["eager_equals_hf"] = eager == result["hf_tokens"]
    modes = {"eager": eager}
    if graphs_runner is not None:
        graphs = DecodeGraphs(fwd, graphs_runner, 8, 4096, device, sizes=[1, 2, 4, 8])
        graphs.capture_all()
        graphed = generate(MiniEngine(fwd, device, len(prompts), 4096), prompts, shared,
                           new_tokens, chunk, decode=graphs.run)
        result["graph_tokens"] = graphed
        result["graph_equals_hf"] = graphed == result["hf_tokens"]
        result["graph_equals_eager"] = graphed == eager
        modes["graph"] = graphed
        graphs_runner.reset()
    for name, toks in modes.items():
        # where a mode first differs from transformers, and how close transformers' top two
        # logits were there (a near-tie flips on rounding alone)
        diverge = []
        for r, (mine, (theirs, margins)) in enumerate(zip(toks, ref, strict=True)):
            i = next((j for j, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a != b),
                     None)
            if i is not None:
                diverge.append({"request": r, "step": i, "hf_margin": margins[i]})
        result[f"{name}_divergences"] = diverge
        same = sum(a == b for m, t in zip(toks, ref, strict=True)
                   for a, b in zip(m, t[0], strict=True))
        result[f"{name}_token_match_rate"] = same / sum(len(t[0]) for t in ref)
    return result


def bf16_noise_floor(cfg: dict[str, Any], platform: Any,
                     dev: torch.device = torch.device("cuda")) -> dict[str, Any]:
    """Prefill logits of tessera-bf16 and transformers-bf16 against transformers in fp32 on
    the same (bf16-rounded) weights: if tessera's error is of the size of transformers' own,
    token divergences in bf16 are rounding, not a bug. Also the same prompt prefilled in two
    chunks (the second over the cached first) against one pass."""
    import copy

    hf, model = build_pair(cfg, platform, torch.bfloat16, dev, max_positions=4096)
    hf32 = copy.deepcopy(hf).float()
    kv = platform.create_kv_arena(len(model.layers), 16384, model.tp.num_kv_heads,
                                  cfg["head_dim"], torch.bfloat16)

    def fwd(inp: ForwardInputs) -> torch.Tensor:
        with torch.inference_mode():
            return model(inp, kv)

    engine = MiniEngine(fwd, dev, 16, 4096)
    gen = torch.Generator().manual_seed(4)
    rows = []
    for r, n in enumerate((7, 45, 130, 300, 700)):
        prompt = torch.randint(0, cfg["vocab_size"], (n,), generator=gen).tolist()
        engine.alloc(r, 0, n)
        engine.alloc(r + 8, 0, n)
        with torch.inference_mode():
            ids = torch.tensor([prompt], device=dev)
            ref = hf32(ids).logits[0, -1].float()
            theirs = hf(ids).logits[0, -1].float()
            mine = fwd(engine.inputs([(r, prompt, 0, True)]))[0]
            half = n // 2
            if half:
                fwd(engine.inputs([(r + 8, prompt[:half], 0, False)]))
            chunked = fwd(engine.inputs([(r + 8, prompt[half:], half, True)]))[0]

        def rel(a: torch.Tensor, ref: torch.Tensor = ref) -> float:
            return float((a - ref).norm() / ref.norm())

        top = ref.topk(2).values
        rows.append({"prompt_len": n, "tessera_rel_err": rel(mine), "hf_bf16_rel_err": rel(theirs),
                     "tessera_chunked_rel_err": rel(chunked),
                     "chunked_vs_one_pass_max_abs": float((chunked - mine).abs().max()),
                     "top1": [int(ref.argmax()), int(mine.argmax()), int(theirs.argmax())],
                     "ref_margin": float(top[0] - top[1])})
    return {"rows": rows,
            "tessera_rel_err_mean": sum(r["tessera_rel_err"] for r in rows) / len(rows),
            "hf_bf16_rel_err_mean": sum(r["hf_bf16_rel_err"] for r in rows) / len(rows)}


def _reference_in_fp32(name: str) -> Callable[..., Any]:
    """The reference op on fp32 copies of the inputs, outputs cast back to the input dtype
    (store_kv runs in place on the real caches)."""
    from tessera.hal.reference import reference_op

    ref = reference_op(name)
    if name == "store_kv":
        return ref

    def run(*args: Any) -> Any:
        dtype = next(a.dtype for a in args if isinstance(a, torch.Tensor)
                     and a.is_floating_point())
        up = [a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
              for a in args]
        out = ref(*up)
        if isinstance(out, tuple):
            return tuple(o.to(dtype) for o in out)
        return out.to(dtype)
    return run


def bf16_op_swaps(cfg: dict[str, Any], platform: Any,
                  dev: torch.device = torch.device("cuda")) -> dict[str, Any]:
    """Which op makes tessera-bf16 drift from transformers-fp32 on long prompts: the same
    prefill with one cuda op at a time replaced by the reference (fp32 math, bf16 out), and
    each op's own error against the reference on the inputs it actually saw."""
    import copy

    hf, model = build_pair(cfg, platform, torch.bfloat16, dev, max_positions=4096)
    hf32 = copy.deepcopy(hf).float()
    kv = platform.create_kv_arena(len(model.layers), 4096, model.tp.num_kv_heads,
                                  cfg["head_dim"], torch.bfloat16)
    engine = MiniEngine(lambda inp: model(inp, kv), dev, 4, 2048)
    gen = torch.Generator().manual_seed(5)
    prompts = {n: torch.randint(0, cfg["vocab_size"], (n,), generator=gen).tolist()
               for n in (45, 700)}
    for r, n in enumerate(prompts):
        engine.alloc(r, 0, n)
    refs = {}
    with torch.inference_mode():
        for n, p in prompts.items():
            refs[n] = hf32(torch.tensor([p], device=dev)).logits[0, -1].float()
    own = dict(model.ops)
    result: dict[str, Any] = {}
    for swap in (None, "attention_extend", "rotary_embedding", "rms_norm",
                 "fused_add_rms_norm", "silu_and_mul", "store_kv", "linear"):
        model.ops = dict(own)
        if swap is not None:
            model.ops[swap] = _reference_in_fp32(swap)
        errs = {}
        with torch.inference_mode():
            for r, (n, p) in enumerate(prompts.items()):
                logits = engine.model(engine.inputs([(r, p, 0, True)]))[0]
                errs[n] = float((logits - refs[n]).norm() / refs[n].norm())
        result[f"swap_{swap}"] = errs
    # each op's error on its real inputs, no swap
    op_errs: dict[str, float] = {}

    def checking(name: str) -> Callable[..., Any]:
        mine, ref = own[name], _reference_in_fp32(name)

        def run(*args: Any) -> Any:
            out = mine(*args)
            if name not in ("store_kv", "embedding"):
                expect = ref(*args)
                pairs = zip(out, expect, strict=True) if isinstance(out, tuple) else \
                    [(out, expect)]
                for a, b in pairs:
                    err = float((a.float() - b.float()).norm() / b.float().norm().clamp(
                        min=1e-30))
                    op_errs[name] = max(op_errs.get(name, 0.0), err)
            return out
        return run

    model.ops = {name: checking(name) for name in own}
    with torch.inference_mode():
        engine.model(engine.inputs([(1, prompts[700], 0, True)]))
    model.ops = own
    result["per_op_max_rel_err_700"] = op_errs
    return result


# --- GPU-only parts ------------------------------------------------------------------------------
def graphs_vs_eager_every_size(cfg: dict[str, Any], platform: Any, max_bs: int) -> dict[str, Any]:
    from tessera.hal.cuda.graph import capture_batch_sizes
    from tessera.worker_proc.graph_decode import DecodeGraphs

    dev, dtype, width = torch.device("cuda"), torch.bfloat16, 512
    mc = ModelConfig.from_hf_dict(cfg)
    model = random_model(mc, platform, dtype, dev)
    kv = platform.create_kv_arena(mc.num_layers, (max_bs + 1) * width, mc.num_kv_heads,
                                  mc.head_dim, dtype)
    kv.storage.normal_()

    def fwd(inp: ForwardInputs) -> torch.Tensor:
        with torch.inference_mode():
            return model(inp, kv)

    runner = platform.create_graph_runner()
    graphs = DecodeGraphs(fwd, runner, max_bs, width, dev)
    t0 = time.perf_counter()
    graphs.capture_all()
    capture_s = time.perf_counter() - t0
    engine = MiniEngine(fwd, dev, max_bs + 1, width)  # row max_bs: never allocated, slot 0
    for r in range(max_bs):
        engine.alloc(r, 0, width)
    gen = torch.Generator().manual_seed(2)
    per_size = {}
    for bs in capture_batch_sizes(max_bs):
        for batch in sorted({bs, max(1, bs - 1)}):  # exact size, and one padded row
            lens = torch.randint(2, width, (batch,), generator=gen).tolist()
            ids = torch.randint(0, mc.vocab_size, (batch,), generator=gen).tolist()
            inp = engine.inputs([(r, [ids[r]], lens[r] - 1, True) for r in range(batch)])
            eager = fwd(inp).clone()
            replay = graphs.run(inp).clone()
            # the eager forward of the padded batch itself (padding rows as the graph runs
            # them) must give the real rows bit for bit; the unpadded eager batch may differ
            # in rounding only (cuBLAS picks its kernels by M)
            pad = [(max_bs, [0], 0, True)] * (graphs.padded_size(batch) - batch)
            padded = fwd(engine.inputs([(r, [ids[r]], lens[r] - 1, True)
                                        for r in range(batch)] + pad))[:batch]
            per_size[f"{bs}/{batch}"] = {
                "padded_eager_bitwise_equal": bool(torch.equal(padded, replay)),
                "max_abs_diff": float((eager - replay).abs().max()),
                "bitwise_equal": bool(torch.equal(eager, replay)),
                "argmax_equal": bool(torch.equal(eager.argmax(-1), replay.argmax(-1)))}
    runner.reset()
    return {"sizes": capture_batch_sizes(max_bs), "capture_seconds": capture_s,
            "graph_pool_note": "one pool shared by every size, largest captured first",
            "results": per_size,
            "all_exact_sizes_bitwise_equal": all(v["bitwise_equal"] for k, v in per_size.items()
                                                 if k.split("/")[0] == k.split("/")[1]),
            "all_padded_equal_padded_eager": all(v["padded_eager_bitwise_equal"]
                                                 for v in per_size.values())}


def random_model(mc: ModelConfig, platform: Any, dtype: torch.dtype,
                 dev: torch.device) -> LlamaForCausalLM:
    model = LlamaForCausalLM(mc, platform, dtype=dtype, device=dev, max_positions=8192)
    gen = torch.Generator(device=dev).manual_seed(0)

    def tensors() -> Any:
        for name, shape in hf_tensor_shapes(mc).items():
            if name.endswith("norm.weight"):
                yield name, torch.ones(shape, dtype=dtype, device=dev)
            else:
                yield name, (torch.randn(shape, generator=gen, device=dev) * 0.02).to(dtype)

    model.load_weights(tensors())
    return model


def graph_time_us(fn: Callable[[], Any], reps: int = 20, iters: int = 10) -> float:
    """GPU microseconds per call of fn: `reps` calls captured in one CUDA graph, replayed
    `iters` times (no launch gaps, unlike timing eager calls of microsecond kernels)."""
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
    return start.elapsed_time(end) * 1e3 / (iters * reps)


def op_timings() -> dict[str, Any]:
    """Each op of one Llama-3-8B decode layer at batch 1 and 64, timed inside graphs; the
    linears rotate over copies of their weight so that L2 does not hold it."""
    import torch.nn.functional as F

    from tessera.hal.cuda import CudaPlatform
    from tessera.hal.rope import cos_sin_cache

    op = CudaPlatform().op
    dev, dt, h, inter, hq, hk, d = torch.device("cuda"), torch.bfloat16, 4096, 14336, 32, 8, 128
    res: dict[str, Any] = {}
    table = cos_sin_cache(d, 8192, 500000.0, None, dev, dt)
    for batch in (1, 64):
        r: dict[str, float] = {}
        x = torch.randn((batch, h), device=dev, dtype=dt)
        w = torch.ones(h, device=dev, dtype=dt)
        r["rms_norm"] = graph_time_us(lambda: op("rms_norm")(x, w, 1e-5))  # noqa: B023
        r["fused_add_rms_norm"] = graph_time_us(
            lambda: op("fused_add_rms_norm")(x, x, w, 1e-5))  # noqa: B023
        qkv = torch.randn((batch, (hq + 2 * hk) * d), device=dev, dtype=dt)
        q = qkv[:, :hq * d].view(batch, hq, d)
        k = qkv[:, hq * d:(hq + hk) * d].view(batch, hk, d)
        pos = torch.full((batch,), 600, device=dev, dtype=torch.int64)
        r["rotary_embedding"] = graph_time_us(
            lambda: op("rotary_embedding")(pos, q, k, table))  # noqa: B023
        cache = torch.zeros((70000, hk, d), device=dev, dtype=dt)
        slots = torch.arange(batch, device=dev) * 1000 + 17
        r["store_kv"] = graph_time_us(
            lambda: op("store_kv")(cache, cache, k, k, slots))  # noqa: B023
        gu = torch.randn((batch, 2 * inter), device=dev, dtype=dt)
        r["silu_and_mul"] = graph_time_us(lambda: op("silu_and_mul")(gu))  # noqa: B023
        rtt = torch.arange(batch * 1024, device=dev, dtype=torch.int32).view(batch, 1024)
        lens = torch.full((batch,), 600, device=dev, dtype=torch.int32)
        qd = torch.randn((batch, hq, d), device=dev, dtype=dt)
        r["attention_decode_s600"] = graph_time_us(
            lambda: op("attention_decode")(qd, cache, cache, rtt, lens, d ** -0.5))  # noqa: B023
        for name, (n_out, n_in) in {"qkv": ((hq + 2 * hk) * d, h), "o": (h, hq * d),
                                    "gate_up": (2 * inter, h), "down": (h, inter),
                                    "lm_head": (128256, h)}.items():
            copies = [torch.randn((n_out, n_in), device=dev, dtype=dt) * 0.02
                      for _ in range(2 if name == "lm_head" else 4)]
            xin = torch.randn((batch, n_in), device=dev, dtype=dt)
            t = [0]

            def gemm(copies: list[torch.Tensor] = copies, xin: torch.Tensor = xin,
                     t: list[int] = t) -> torch.Tensor:
                t[0] += 1
                return F.linear(xin, copies[t[0] % len(copies)])

            us = graph_time_us(gemm, reps=len(copies) * 4)
            r[f"linear_{name}"] = us
            r[f"linear_{name}_TBps"] = n_out * n_in * 2 / (us * 1e-6) / 1e12
            del copies
        layer_ops = ("rms_norm", "fused_add_rms_norm", "rotary_embedding", "store_kv",
                     "silu_and_mul", "attention_decode_s600", "linear_qkv", "linear_o",
                     "linear_gate_up", "linear_down")
        per_layer = sum(r[k] for k in layer_ops) + r["fused_add_rms_norm"]
        r["sum_per_layer_us"] = per_layer
        r["linears_per_layer_us"] = sum(r[k] for k in layer_ops if k.startswith("linear"))
        r["estimated_step_ms"] = (32 * per_layer + r["linear_lm_head"]) / 1e3
        res[f"b{batch}"] = r
    return res


def gemv_sweep() -> dict[str, Any]:
    """The one-token GEMV against cuBLAS on the Llama-3-8B linears (bf16, inside graphs,
    weights rotated so L2 does not hold them); the winners go into gemv.TUNED for the rest of
    the run (b1_smoke then uses them)."""
    import torch.nn.functional as F

    from tessera.hal.cuda import gemv

    dev, dt = torch.device("cuda"), torch.bfloat16
    shapes = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
              "down": (4096, 14336), "lm_head": (128256, 4096)}
    gemv.TUNED.clear()  # measure every shape afresh
    configs = [(bn, bk, nw) for bn in (1, 2, 4, 8)
               for bk, nw in ((1024, 4), (2048, 8), (4096, 8), (4096, 16))]
    res: dict[str, Any] = {}
    for name, (n_out, n_in) in shapes.items():
        copies = [torch.randn((n_out, n_in), device=dev, dtype=dt) * 0.02
                  for _ in range(2 if name == "lm_head" else 4)]
        x = torch.randn((1, n_in), device=dev, dtype=dt)
        nbytes = n_out * n_in * 2

        def timed(fn: Callable[[torch.Tensor], torch.Tensor], copies: list[torch.Tensor] = copies
                  ) -> float:
            t = [0]

            def call() -> torch.Tensor:
                t[0] += 1
                return fn(copies[t[0] % len(copies)])
            return graph_time_us(call, reps=len(copies) * 4)

        row: dict[str, Any] = {"cublas_us": timed(lambda w: F.linear(x, w))}  # noqa: B023
        ref = F.linear(x.float(), copies[0].float())
        best = None
        for bn, bk, nw in configs:
            key = f"bn{bn}_bk{bk}_w{nw}"
            try:
                out = gemv.gemv(x, copies[0], None, bn, bk, nw).float()
                err = float((out - ref).norm() / ref.norm())
                us = timed(lambda w, bn=bn, bk=bk, nw=nw: gemv.gemv(x, w, None, bn, bk, nw))  # noqa: B023
                row[key] = {"us": us, "TBps": nbytes / (us * 1e-6) / 1e12, "rel_err": err}
                if err < 1e-2 and (best is None or us < best[0]):
                    best = (us, (bn, bk, nw))
            except Exception as exc:
                row[key] = {"error": repr(exc)[:300]}
        row["cublas_TBps"] = nbytes / (row["cublas_us"] * 1e-6) / 1e12
        if best is not None and best[0] < 0.97 * row["cublas_us"]:
            gemv.TUNED[(n_out, n_in)] = best[1]
            row["chosen"] = list(best[1])
            row["chosen_us"] = best[0]
        res[name] = row
    res["tuned"] = {f"{k[0]}x{k[1]}": list(v) for k, v in gemv.TUNED.items()}
    return res


def decode_attention_bench() -> dict[str, Any]:
    from tessera.hal.cuda import decode_attention as da
    from tessera.hal.reference import reference_op

    hq, hk, d, dtype = 32, 8, 128, torch.bfloat16
    # Timed inside graphs (20 calls per replay); the small cases fit in L2, so they measure
    # latency more than bandwidth.
    cases = [(1, 512), (1, 8192), (16, 2048), (64, 2048), (128, 4096)]
    configs = [(64, 4, 2), (32, 4, 2), (64, 4, 3), (128, 8, 2), (64, 8, 2), (32, 2, 3)]
    out: dict[str, Any] = {"shape": {"hq": hq, "hk": hk, "head_dim": d, "dtype": "bfloat16"},
                           "cases": {}}
    default = (da.BLOCK_N, da.NUM_WARPS, da.NUM_STAGES)
    for batch, seq in cases:
        slots = batch * seq + PAGE
        kc = torch.randn((slots, hk, d), device="cuda", dtype=dtype)
        vc = torch.randn_like(kc)
        pages = torch.randperm(slots // PAGE - 1, device="cuda")[:batch * seq // PAGE] + 1
        rtt = (pages.view(batch, -1)[:, :, None] * PAGE
               + torch.arange(PAGE, device="cuda")).reshape(batch, seq).int()
        lens = torch.full((batch,), seq, dtype=torch.int32, device="cuda")
        q = torch.randn((batch, hq, d), device="cuda", dtype=dtype)
        kv_bytes = batch * seq * hk * d * 2 * 2
        case: dict[str, Any] = {"kv_bytes": kv_bytes,
                                "splits": da.num_splits(batch, hk, q.device)}
        for bn, nw, ns in configs:
            da.BLOCK_N, da.NUM_WARPS, da.NUM_STAGES = bn, nw, ns
            try:
                us = graph_time_us(
                    lambda: da.attention_decode(q, kc, vc, rtt, lens, d ** -0.5))  # noqa: B023
                case[f"bn{bn}_w{nw}_s{ns}"] = {"us": us, "GBps": kv_bytes / (us * 1e-6) / 1e9}
            except Exception as exc:  # a config that does not compile is a result too
                case[f"bn{bn}_w{nw}_s{ns}"] = {"error": repr(exc)[:300]}
        da.BLOCK_N, da.NUM_WARPS, da.NUM_STAGES = default
        if batch * seq <= 16 * 2048:
            got = da.attention_decode(q, kc, vc, rtt, lens, d ** -0.5).float()
            ext = torch.ones(batch, dtype=torch.int32, device="cuda")
            indptr = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
            ref = reference_op("attention_extend")(q.float(), kc.float(), vc.float(), rtt, lens,
                                                   ext, indptr, d ** -0.5)
            case["rel_err_vs_fp32_reference"] = float((got - ref).norm() / ref.norm())
        out["cases"][f"b{batch}_s{seq}"] = case
    return out


def b1_smoke(platform: Any) -> dict[str, Any]:
    """Llama-3-8B shape, bf16, random weights: 512-token prefill (TTFT) and 128 decode steps at
    batch 1 through a captured graph; eager and larger batches for comparison."""
    from tessera.worker_proc.graph_decode import DecodeGraphs

    cfg = json.loads((ROOT / "benchmarks/configs/llama3-8b.json").read_text())
    mc = ModelConfig.from_hf_dict(cfg)
    dev, dtype, width = torch.device("cuda"), torch.bfloat16, 1024
    model = random_model(mc, platform, dtype, dev)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kv = platform.create_kv_arena(mc.num_layers, 65 * width, mc.num_kv_heads, mc.head_dim, dtype)

    def fwd(inp: ForwardInputs) -> torch.Tensor:
        with torch.inference_mode():
            return model(inp, kv)

    engine = MiniEngine(fwd, dev, 64, width)
    for r in range(64):
        engine.alloc(r, 0, width)
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, mc.vocab_size, (512,), generator=gen).tolist()
    ttft = []
    for _ in range(6):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        tok = int(fwd(engine.inputs([(0, prompt, 0, True)])).argmax(-1)[0])
        ttft.append((time.perf_counter() - t0) * 1e3)
    res: dict[str, Any] = {"weight_bytes": weight_bytes, "prompt_tokens": 512,
                           "ttft_ms_median": sorted(ttft[1:])[len(ttft[1:]) // 2],
                           "ttft_ms_all": ttft}
    runner = platform.create_graph_runner()
    graphs = DecodeGraphs(fwd, runner, 64, width, dev, sizes=[1, 16, 64])
    graphs.capture_all()

    def decode_loop(run: Callable[[ForwardInputs], torch.Tensor], batch: int, steps: int,
                    start_tok: int) -> float:
        toks = [start_tok] * batch
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(steps):
            inp = engine.inputs([(r, [toks[r]], 512 + i, True) for r in range(batch)])
            toks = run(inp).argmax(-1).tolist()  # host sync each step, as serving does
        return (time.perf_counter() - t0) * 1e3 / steps

    decode_loop(graphs.run, 1, 5, tok)
    res["decode_ms_per_step_graph_b1"] = decode_loop(graphs.run, 1, 128, tok)
    res["decode_ms_per_step_eager_b1"] = decode_loop(fwd, 1, 16, tok)
    # replay alone (inputs already on the device): the GPU time of one step
    graphs.run(engine.inputs([(0, [tok], 600, True)]))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(50):
        runner.replay(1)
    end.record()
    torch.cuda.synchronize()
    res["replay_only_ms_b1"] = start.elapsed_time(end) / 50
    for batch in (16, 64):
        res[f"decode_ms_per_step_graph_b{batch}"] = decode_loop(graphs.run, batch, 32, tok)
    runner.reset()
    from tessera.hal.cuda import decode_attention as da
    from tessera.hal.cuda import gemv

    res["gemv_tuned_shapes"] = [f"{k[0]}x{k[1]}" for k in gemv.TUNED]
    saved, gemv.TUNED = dict(gemv.TUNED), {}
    cublas_only = DecodeGraphs(fwd, runner, 1, width, dev, sizes=[1])
    cublas_only.capture_all()
    cublas_only.run(engine.inputs([(0, [tok], 600, True)]))
    start.record()
    for _ in range(50):
        runner.replay(1)
    end.record()
    torch.cuda.synchronize()
    res["replay_only_ms_b1_cublas_only"] = start.elapsed_time(end) / 50
    runner.reset()
    gemv.TUNED = saved

    default_splits = da.MAX_SPLITS
    for max_splits in (8, 64):
        da.MAX_SPLITS = max_splits
        small = DecodeGraphs(fwd, runner, 1, width, dev, sizes=[1])
        small.capture_all()
        small.run(engine.inputs([(0, [tok], 600, True)]))
        start.record()
        for _ in range(50):
            runner.replay(1)
        end.record()
        torch.cuda.synchronize()
        res[f"replay_only_ms_b1_max_splits{max_splits}"] = start.elapsed_time(end) / 50
        runner.reset()
    da.MAX_SPLITS = default_splits
    res["roofline_ms_b1"] = weight_bytes / 4.22e12 * 1e3
    res["target_ms_b1"] = 4.2
    runner.reset()
    return res


def main(argv: list[str]) -> int:
    out_dir = Path(argv[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    cpu = "--cpu" in argv
    only = [a.split("=", 1)[1] for a in argv if a.startswith("--only=")]
    report: dict[str, Any] = {"torch": torch.__version__}
    if cpu:
        from tessera.hal.cpu import CpuPlatform

        platform: Any = CpuPlatform()
        device = torch.device("cpu")
    else:
        import triton

        from tessera.hal.cuda import CudaPlatform

        platform = CudaPlatform()
        device = torch.device("cuda")
        report.update(triton=triton.__version__, device=torch.cuda.get_device_name(),
                      versions=platform.versions())
    big = json.loads((ROOT / "benchmarks/configs/llama3-8b-4layer.json").read_text())
    parts: dict[str, Callable[[], Any]] = {}
    if cpu:
        parts["vs_hf_fp32"] = lambda: check_against_hf(TINY, platform, torch.float32, device,
                                                       None, 6, [3, 20, 50], 16)
        parts["bf16_noise_floor"] = lambda: bf16_noise_floor(TINY, platform, device)
        parts["bf16_op_swaps"] = lambda: bf16_op_swaps(TINY, platform, device)
    else:
        parts["attention_bench"] = decode_attention_bench
        parts["gemv_sweep"] = gemv_sweep  # first: later parts run with its tuned shapes
        parts["vs_hf_fp32"] = lambda: check_against_hf(
            big, platform, torch.float32, device, platform.create_graph_runner(), 12,
            [7, 45, 130, 300], 128)
        parts["vs_hf_bf16"] = lambda: check_against_hf(
            big, platform, torch.bfloat16, device, platform.create_graph_runner(), 12,
            [7, 45, 130, 300], 128)
        parts["bf16_op_swaps"] = lambda: bf16_op_swaps(big, platform)
        parts["op_timings"] = op_timings
        parts["bf16_noise_floor"] = lambda: bf16_noise_floor(big, platform)
        parts["graphs_vs_eager"] = lambda: graphs_vs_eager_every_size(big, platform, 256)
        parts["b1_smoke"] = lambda: b1_smoke(platform)
    for name, part in parts.items():
        if only and name not in only:
            continue
        log("start", name)
        t0 = time.perf_counter()
        try:
            report[name] = part()
        except Exception:
            report[name] = {"error": traceback.format_exc()[-3000:]}
        report[name + "_seconds"] = time.perf_counter() - t0
        log("done", name, json.dumps(report[name])[:1500])
        (out_dir / "gpu_run.json").write_text(json.dumps(report, indent=1))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
