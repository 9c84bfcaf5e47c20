"""Correctness parts of the GPU run (tests/hal_cuda/gpu_run.py): greedy tokens against
transformers, the bf16 noise floor and per-op drift, graph replay against eager."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from gpu_engine import (
    PAGE,
    MiniEngine,
    build_pair,
    generate,
    hf_greedy,
    random_model,
)

from tessera.formats.config import ModelConfig
from tessera.worker_proc.forward_inputs import ForwardInputs


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

    swaps = OpSwapPlatform(platform)
    hf, model = build_pair(cfg, swaps, torch.bfloat16, dev, max_positions=4096)
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


class OpSwapPlatform:
    """A platform whose ops can be swapped after a model is built: the layers hold
    trampolines that call `table[name]` at every call."""

    def __init__(self, platform: Any) -> None:
        self.platform = platform
        self.table: dict[str, Callable[..., Any]] = {}
        self.looked_up: set[str] = set()

    def op(self, name: str) -> Callable[..., Any]:
        self.looked_up.add(name)
        self.table.setdefault(name, self.platform.op(name))
        return lambda *args, **kwargs: self.table[name](*args, **kwargs)

    def fused_op(self, name: str) -> None:
        # Swaps are per plain op: the layers compose them, so that each one can be swapped.
        return None

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.platform, attr)


def bf16_op_swaps(cfg: dict[str, Any], platform: Any,
                  dev: torch.device = torch.device("cuda")) -> dict[str, Any]:
    """Which op makes tessera-bf16 drift from transformers-fp32 on long prompts: the same
    prefill with one cuda op at a time replaced by the reference (fp32 math, bf16 out), and
    each op's own error against the reference on the inputs it actually saw."""
    import copy

    swaps = OpSwapPlatform(platform)
    hf, model = build_pair(cfg, swaps, torch.bfloat16, dev, max_positions=4096)
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
    own = {name: platform.op(name) for name in swaps.looked_up}
    result: dict[str, Any] = {}
    for swap in (None, "attention_extend", "rotary_embedding", "rms_norm",
                 "fused_add_rms_norm", "silu_and_mul", "store_kv", "linear"):
        swaps.table = dict(own)
        if swap is not None:
            swaps.table[swap] = _reference_in_fp32(swap)
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

    swaps.table = {name: checking(name) for name in own}
    with torch.inference_mode():
        engine.model(engine.inputs([(1, prompts[700], 0, True)]))
    swaps.table = own
    result["per_op_max_rel_err_700"] = op_errs
    return result


def graphs_vs_eager_every_size(cfg: dict[str, Any], platform: Any, max_bs: int) -> dict[str, Any]:
    from tessera.worker_proc.graph_decode import DecodeGraphs, capture_batch_sizes

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
