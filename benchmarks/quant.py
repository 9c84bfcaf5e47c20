"""`tessera bench quant`: B12, quantized weights and KV cache beside the unquantized model, one
run.

    --schemes bf16,fp8,int4   variants: the unquantized model ("bf16": --quantization none in
                              the serving dtype, named after it), schemes quantized at load
                              (fp8, int8, int4), the same with the LM head quantized too
                              ("fp8+head": --quantize-lm-head), and "checkpoint" (a quantized
                              checkpoint's own weights kept, --quantization auto)
    --parts kl,b1,b2,kv       what to measure:
      kl   mean KL(reference || scheme) of next-token distributions on a fixed prompt set,
           same weights (benchmarks/quant_kl.py), for every variant but the reference, and
           of the reference over an fp8 KV cache (kv_fp8_kl; with --kv-cache-dtype auto)
      b1   B1 per variant: batch 1, --prompt-len / --output-len, decode ms/step and TTFT
           (median of --iters), with the weight-streaming roofline of the step
      b2   B2 per variant: --num-requests offline requests, output tokens/s
      kv   B2 of the unquantized model with a KV pool of --kv-pool-tokens in the serving
           dtype, against --kv-cache-dtype fp8_e4m3 in the same bytes (twice the tokens):
           tokens/s and retractions side by side
Each variant is one engine start (b1 and b2 share it). The figure names are BENCHMARKS.md's:
bf16_decode_ms_per_step, fp8_decode_ms_per_step, int4_decode_ms_per_step, fp8_b2_speedup,
fp8_kl, int4_kl (+ per-variant details). `--merge` adds the figures to an existing result of
the same name, so the parts can run as separate commands.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict
from typing import Any

from tessera.benchmarks.common import default_results_dir, new_result, write_result
from tessera.benchmarks.datasets import parse_range, random_requests
from tessera.benchmarks.engine_args import (
    add_engine_args,
    host_path,
    resolve_engine,
    scheduler_stats,
    worker_stats,
)

TARGETS = {"fp8_decode_ms_per_step": ("<=", 2.3), "int4_decode_ms_per_step": ("<=", 1.5),
           "fp8_b2_speedup": (">=", 1.5)}
PARTS = ("kl", "b1", "b2", "kv")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--schemes", default="bf16,fp8,int4",
                   help="variants, the first one the reference (see above)")
    p.add_argument("--parts", default=",".join(PARTS))
    p.add_argument("--prompt-len", type=int, default=512, help="B1 prompt")
    p.add_argument("--output-len", type=int, default=128, help="B1 output")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--num-requests", type=int, default=256, help="B2 requests")
    p.add_argument("--b2-prompt-len", default="100,1024")
    p.add_argument("--b2-output-len", default="100,1024")
    p.add_argument("--kv-pool-tokens", type=int, default=65536,
                   help="KV pool of the serving-dtype run of the kv part (fp8 gets twice)")
    p.add_argument("--kl-prompts", type=int, default=32)
    p.add_argument("--kl-prompt-len", default="16,256", help="KL prompt lengths, min,max")
    p.add_argument("--dataset-seed", type=int, default=0)
    p.add_argument("--bandwidth-gbps", type=float, default=None,
                   help="for the decode roofline (default: measured)")
    p.add_argument("--out-dir", default=default_results_dir())
    p.add_argument("--name", default="b12_quant")
    p.add_argument("--merge", action="store_true",
                   help="add to the figures of an existing result of this name")


def _log(msg: str) -> None:
    print(f"[bench] B12 {msg}", file=sys.stderr, flush=True)


def variant_kwargs(base: dict[str, Any], variant: str) -> dict[str, Any]:
    """Engine kwargs of one variant: the reference runs unquantized, "checkpoint" keeps a
    quantized checkpoint's weights, a scheme quantizes at load ("SCHEME+head": the LM head
    too)."""
    if variant in ("bf16", "fp32", "float16", "float"):
        return {**base, "quantization": "none"}
    if variant == "checkpoint":
        return {**base, "quantization": "auto"}
    scheme, plus, extra = variant.partition("+")
    if plus:
        if extra != "head":
            raise ValueError(f"variant {variant!r}: the one suffix is +head (--quantize-lm-head)")
        return {**base, "quantization": scheme, "quantize_lm_head": True}
    return {**base, "quantization": variant}


def part_kl(base: dict[str, Any], variants: list[str], vocab: int, count: int,
            seed: int, lengths: tuple[int, int]) -> dict[str, Any]:
    from tessera.benchmarks.quant_kl import kl_divergence, next_token_logits, prompt_set

    prompts = prompt_set(vocab, count, seed, lengths)
    reference = next_token_logits(variant_kwargs(base, variants[0]), prompts)
    figures: dict[str, Any] = {}
    for v in variants[1:]:
        result = kl_divergence(reference, next_token_logits(variant_kwargs(base, v), prompts))
        _log(f"{v}: mean KL {result.mean_kl:.3g} nats, top-1 agreement "
             f"{result.top1_agreement:.3f} over {result.prompts} prompts")
        figures[f"{v}_kl"] = result.mean_kl
        figures[f"{v}_kl_detail"] = asdict(result)
    if base.get("kv_cache_dtype", "auto") == "auto":
        # The fp8 KV cache's own accuracy: the reference's weights, its cache in e4m3 (the
        # prompts' attention reads the stored cache), against the reference.
        kv_kwargs = {**variant_kwargs(base, variants[0]), "kv_cache_dtype": "fp8_e4m3"}
        try:
            result = kl_divergence(reference, next_token_logits(kv_kwargs, prompts))
        except ValueError as exc:  # a plugin that declares no fp8 KV cache
            figures["kv_fp8_kl_error"] = str(exc)
        else:
            _log(f"kv fp8_e4m3: mean KL {result.mean_kl:.3g} nats, top-1 agreement "
                 f"{result.top1_agreement:.3f} over {result.prompts} prompts")
            figures["kv_fp8_kl"] = result.mean_kl
            figures["kv_fp8_kl_detail"] = asdict(result)
    return figures


def _worker_stats(llm: Any, wait_s: float = 15.0) -> dict[str, float]:
    """Worker rank 0's heartbeat numbers, once a heartbeat carrying its memory has come (the
    first after ready may not yet; a busy machine may miss a status call): {} after
    `wait_s`."""
    deadline = time.monotonic() + wait_s
    stats: dict[str, float] = {}
    while True:
        try:
            stats = dict(llm.status().get("worker0", {}).get("stats", {}))
        except Exception:  # noqa: BLE001 - a missing figure, not a failed benchmark
            stats = {}
        if "weight_bytes" in stats or time.monotonic() > deadline:
            return stats
        time.sleep(0.2)


def run_b1(llm: Any, args: argparse.Namespace, vocab: int) -> dict[str, Any]:
    from tessera.bus.messages import SamplingParams

    reqs = random_requests(args.warmup + args.iters, (args.prompt_len, args.prompt_len),
                           (args.output_len, args.output_len), vocab, args.dataset_seed)
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    decode, ttft = [], []
    before: dict[str, float] = {}
    for i, req in enumerate(reqs):
        if i == args.warmup:  # the answering worker's counters over the measured requests
            time.sleep(2 * llm.config.heartbeat_interval_s)
            before = worker_stats(llm).get("worker0", {})
        (out,) = llm.generate([req.prompt_ids], params, stream=True, use_tqdm=False)
        if i < args.warmup:
            continue
        times = out.token_times
        if len(times) >= 2:
            decode.append((times[-1] - times[0]) / (len(times) - 1) * 1000.0)
        if out.ttft_s is not None:
            ttft.append(out.ttft_s * 1000.0)
    time.sleep(2 * llm.config.heartbeat_interval_s)
    host = host_path(before, worker_stats(llm).get("worker0", {}))
    return {"decode_ms_per_step": statistics.median(decode) if decode else float("nan"),
            "ttft_ms": statistics.median(ttft) if ttft else float("nan"),
            "decode_ms_per_step_all": decode, "host": host}


def run_b2(llm: Any, args: argparse.Namespace, vocab: int) -> dict[str, Any]:
    from tessera.bus.messages import SamplingParams

    reqs = random_requests(args.num_requests, parse_range(args.b2_prompt_len),
                           parse_range(args.b2_output_len), vocab, args.dataset_seed)
    params = [SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True)
              for r in reqs]
    llm.generate([reqs[0].prompt_ids[:16]], SamplingParams(max_tokens=4, ignore_eos=True),
                 use_tqdm=False)
    before = scheduler_stats(llm)
    start = time.perf_counter()
    outs = llm.generate([r.prompt_ids for r in reqs], params, use_tqdm=False)
    wall = time.perf_counter() - start
    time.sleep(1.0)  # a fresh heartbeat carries the counters
    after = scheduler_stats(llm)
    tokens = sum(o.completion_tokens for o in outs)
    return {"output_tok_per_s": tokens / wall, "duration_s": wall, "output_tokens": tokens,
            "retractions": after.get("retracted_total", 0.0) - before.get("retracted_total", 0.0)}


def decode_roofline_ms(weight_bytes: float, embed_bytes: float, kv_bytes: float,
                       bandwidth_gbps: float) -> float:
    """The bytes one batch-1 decode step must read (every weight but the embedding table,
    which is only gathered, plus the context's KV) over the bandwidth."""
    return (weight_bytes - embed_bytes + kv_bytes) / (bandwidth_gbps * 1e9) * 1000.0


def part_engine(base: dict[str, Any], variants: list[str], parts: set[str],
                args: argparse.Namespace, mconf: Any, dtype: str,
                bandwidth: float | None) -> dict[str, Any]:
    from tessera.offline import LLM

    figures: dict[str, Any] = {}
    elem = 2 if dtype in ("bfloat16", "float16") else 4
    embed = mconf.vocab_size * mconf.hidden_size * elem if not mconf.tie_word_embeddings else 0
    kv_per_token = 2 * mconf.num_layers * mconf.num_kv_heads * mconf.head_dim * elem
    for v in variants:
        start = time.perf_counter()
        with LLM(**variant_kwargs(base, v)) as llm:
            ready = time.perf_counter() - start
            stats = _worker_stats(llm)
            figures[f"{v}_weight_bytes"] = stats.get("weight_bytes")
            figures[f"{v}_worker_rss_bytes"] = stats.get("rss_bytes")
            figures[f"{v}_ready_s"] = ready
            if "b1" in parts:
                b1 = run_b1(llm, args, mconf.vocab_size)
                figures[f"{v}_decode_ms_per_step"] = b1["decode_ms_per_step"]
                figures[f"{v}_ttft_ms"] = b1["ttft_ms"]
                figures[f"{v}_decode_ms_per_step_all"] = b1["decode_ms_per_step_all"]
                # the worker's host path per step: launch work, and the round trip from a
                # result to the next batch where it waited for one
                figures[f"{v}_worker_launch_ms_per_step"] = b1["host"]["launch_ms_per_step"]
                figures[f"{v}_worker_round_trip_ms"] = b1["host"]["round_trip_ms"]
                if bandwidth and stats.get("weight_bytes"):
                    context = args.prompt_len + args.output_len // 2
                    bound = decode_roofline_ms(stats["weight_bytes"], embed,
                                               context * kv_per_token, bandwidth)
                    figures[f"{v}_roofline_decode_ms_per_step"] = bound
                    figures[f"{v}_roofline_fraction"] = bound / b1["decode_ms_per_step"]
                _log(f"{v}: B1 {b1['decode_ms_per_step']:.3f} ms/step, TTFT "
                     f"{b1['ttft_ms']:.1f} ms")
            if "b2" in parts:
                b2 = run_b2(llm, args, mconf.vocab_size)
                figures[f"{v}_b2_output_tok_per_s"] = b2["output_tok_per_s"]
                figures[f"{v}_b2_retractions"] = b2["retractions"]
                _log(f"{v}: B2 {b2['output_tok_per_s']:.0f} output tok/s")
    ref = variants[0]
    for v in variants[1:]:
        if "b2" in parts and figures.get(f"{ref}_b2_output_tok_per_s"):
            figures[f"{v}_b2_speedup"] = figures[f"{v}_b2_output_tok_per_s"] / \
                figures[f"{ref}_b2_output_tok_per_s"]
    return figures


def part_kv(base: dict[str, Any], args: argparse.Namespace, mconf: Any) -> dict[str, Any]:
    """The same KV bytes: --kv-pool-tokens in the serving dtype, twice as many in fp8."""
    from tessera.offline import LLM

    figures: dict[str, Any] = {}
    for name, extra in (("kv_auto", {"kv_cache_dtype": "auto",
                                     "max_total_tokens": args.kv_pool_tokens}),
                        ("kv_fp8", {"kv_cache_dtype": "fp8_e4m3",
                                    "max_total_tokens": 2 * args.kv_pool_tokens})):
        with LLM(**{**base, "quantization": "none", **extra}) as llm:
            b2 = run_b2(llm, args, mconf.vocab_size)
        figures[f"{name}_pool_tokens"] = extra["max_total_tokens"]
        figures[f"{name}_b2_output_tok_per_s"] = b2["output_tok_per_s"]
        figures[f"{name}_retractions"] = b2["retractions"]
        _log(f"{name}: pool {extra['max_total_tokens']} tokens, {b2['output_tok_per_s']:.0f} "
             f"tok/s, {b2['retractions']:.0f} retractions")
    if figures.get("kv_auto_b2_output_tok_per_s"):
        figures["kv_fp8_b2_speedup"] = figures["kv_fp8_b2_output_tok_per_s"] / \
            figures["kv_auto_b2_output_tok_per_s"]
    return figures


def check_targets(figures: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, (op, bound) in TARGETS.items():
        value = figures.get(key)
        if isinstance(value, int | float):
            out[key] = {"target": f"{op} {bound}", "met": value <= bound if op == "<=" else
                        value >= bound}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tessera bench quant", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(p)
    add_engine_args(p)
    args = p.parse_args(argv)
    base, engine, dev_name, dtype, mconf = resolve_engine(args)
    variants = [v.strip() for v in args.schemes.split(",") if v.strip()]
    parts = {x.strip() for x in args.parts.split(",") if x.strip()}
    unknown = parts - set(PARTS)
    if unknown or not variants:
        p.error(f"--parts takes {', '.join(PARTS)}; --schemes at least one variant")
    bandwidth = args.bandwidth_gbps
    if "b1" in parts and bandwidth is None and dev_name != "cpu":
        from tessera.benchmarks.device_probe import probe

        bandwidth = probe(dev_name, dtype, None, 1.0)[0].bandwidth_gbps
    figures: dict[str, Any] = {}
    path = os.path.join(args.out_dir, f"{args.name}.json")
    if args.merge and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            figures.update(json.load(f).get("figures", {}))
    if "kl" in parts:
        figures.update(part_kl(base, variants, mconf.vocab_size, args.kl_prompts,
                               args.dataset_seed, parse_range(args.kl_prompt_len)))
    if parts & {"b1", "b2"}:
        figures.update(part_engine(base, variants, parts, args, mconf, dtype, bandwidth))
    if "kv" in parts:
        figures.update(part_kv(base, args, mconf))
    if dev_name != "cpu":  # the targets are the H200's (BENCHMARKS.md)
        figures["targets"] = check_targets(figures)
    result = new_result("B12", {**vars(args), "engine": base, "dtype": dtype})
    result["figures"] = figures
    out = write_result(result, args.out_dir, args.name)
    _log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
