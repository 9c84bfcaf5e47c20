"""The op table contract: the names every plugin implements and their exact semantics.

All tensors are torch tensors on the plugin's device. T = tokens in the step, B = requests,
H = hidden size, Hq / Hk = query / KV heads, D = head dim, V = vocabulary, S = KV slots,
L = row length of the page table. Integer index tensors may be int32 or int64.

    embedding(ids[T], weight[V, H]) -> [T, H]
    rms_norm(x[T, H], weight[H], eps: float) -> [T, H]
        x / sqrt(mean(x^2) + eps) * weight, computed in fp32, returned in x.dtype
    fused_add_rms_norm(x[T, H], residual[T, H], weight[H], eps) -> (out[T, H], residual_out[T, H])
        residual_out = x + residual; out = rms_norm(residual_out)
    rotary_embedding(positions[T], q[T, Hq, D], k[T, Hk, D], cos_sin[P, D]) -> (q_out, k_out)
        rotate-half (NeoX / Hugging Face Llama) style; cos_sin[p, :D//2] is cos, [p, D//2:] is
        sin of position p (build it with `hal.rope.cos_sin_cache`, which applies rope scaling)
    silu_and_mul(x[T, 2I]) -> [T, I]                  silu(x[:, :I]) * x[:, I:]
    gelu_tanh_and_mul(x[T, 2I]) -> [T, I]             gelu_tanh(x[:, :I]) * x[:, I:]
        gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) (Gemma's MLP). Both
        compute in fp32 and round once to x.dtype.
    linear(x[T, In], weight[Out, In], bias[Out] | None) -> [T, Out]
        A quantized weight (hal/quant: QuantizedWeight of scheme fp8, int8 or int4) goes
        through `platform.linear_kernel(scheme)` instead, resolved once per layer: the same
        product with y = x @ dequantize(w)^T as its definition. A plugin lists the schemes it
        runs in Capabilities.quant_schemes; any other scheme is its declared reference
        fallback or a MissingSchemeError, never a silent slow path (hal/base.py).
    store_kv(k_cache[S, Hk, D], v_cache[S, Hk, D], k[T, Hk, D], v[T, Hk, D], slots[T]) -> None
        k_cache[slots[t]] = k[t]; v_cache[slots[t]] = v[t]   (in place)
        An fp8 KV cache (float8_e4m3fn, Capabilities.kv_cache_dtypes "fp8_e4m3") adds the
        keywords k_scale, v_scale (floats, one pair per layer): the cache holds k / k_scale,
        saturated to +-448, rounded to nearest. The worker passes them only to a plugin that
        declares the fp8 KV cache, and passes the same scales to the attention ops, which then
        read K = k_cache * k_scale and V = v_cache * v_scale.
    attention_extend(q[T, Hq, D], k_cache, v_cache, req_to_token[B, L], seq_lens[B],
                     extend_lens[B], qo_indptr[B + 1], scale: float,
                     max_extend_len: int | None = None, *, sliding_window: int = 0,
                     logit_cap: float = 0.0) -> [T, Hq, D]
        Ragged causal attention over paged KV, cached prefix included (the radix attention
        forward). Request b owns queries q[qo_indptr[b]:qo_indptr[b+1]] (extend_lens[b] of
        them) at positions seq_lens[b] - extend_lens[b] + i; query i attends to the KV in
        slots req_to_token[b, 0 : seq_lens[b] - extend_lens[b] + i + 1]. The new tokens' KV is
        already stored. GQA: query head h reads KV head h // (Hq // Hk). Rows of q after
        qo_indptr[B] belong to no request (the padding of a step captured at a larger size,
        whose padding requests have extend_lens == seq_lens == 0): their output is zeros.
        `max_extend_len`, when given, is max(extend_lens), known on the host: a plugin must
        not read it back from the device then (the worker calls this once per layer); a
        graph-captured step passes its padded token count instead, an upper bound.
        sliding_window > 0: the query at position p attends only to positions
        p - sliding_window + 1 .. p (the last sliding_window, itself included), as
        transformers' sliding-window mask does; a plugin should skip the KV outside the window
        rather than mask it. logit_cap > 0 soft-caps the scores before the softmax:
        s = logit_cap * tanh(q.k * scale / logit_cap) (Gemma 2). Both 0: plain causal.
        (+ k_scale, v_scale keywords over an fp8 cache: see store_kv.)
    attention_decode(q[B, Hq, D], k_cache, v_cache, req_to_token[B, L], seq_lens[B],
                     scale: float, *, sliding_window: int = 0, logit_cap: float = 0.0)
                     -> [B, Hq, D]
        attention_extend with extend_lens == 1, for static decode shapes (graph capture).
    fused_moe(x[T, H], w13[E, 2I, H], w2[E, H, I], topk_weights[T, K] float32, topk_ids[T, K],
              activation: str = "silu") -> [T, H]
        The Mixture-of-Experts MLP over the E experts this rank holds: for every token t and
        choice k whose expert e = topk_ids[t, k] is in [0, E),
            out[t] += topk_weights[t, k] * (w2[e] @ act_and_mul(w13[e] @ x[t]))
        with act_and_mul = silu_and_mul ("silu") or gelu_tanh_and_mul ("gelu_tanh") on the
        [gate | up] rows of w13. A choice outside [0, E) adds nothing: expert parallelism
        marks the experts held by other ranks so. Each expert's gate/up product and its
        activation are rounded to x.dtype (as separate linears would be); the weighted sum
        over the K choices may be accumulated in fp32; the output is in x.dtype. How tokens
        are grouped by expert (sorting, padding, grouped GEMM) is the plugin's business.
    sample(logits[B, V] float32, params: SamplingTensors) -> token ids int64[B]
        temperature == 0 (or top_k == 1) is greedy (argmax, lowest index on ties). Where
        params.all_greedy the logits may also come in bfloat16 or float16 (a decode graph's,
        unconverted): the tokens are those of their float32 copy, ties included. Otherwise
        logits / temperature, then top-k (k <= 0: off), top-p, min-p filtering, then a draw.
        A row with seed >= 0 draws from a stream determined by (seed, offset) only, so a seeded
        request is reproducible on the same plugin whatever else is in the batch.
    apply_token_mask(logits[B, V] float32, bitmask[G, W] int32, rows[G]) -> None
        In place: a grammar's allowed-token mask on G rows of the logits. Token v of row
        rows[g] keeps its logit when bit v % 32 of bitmask[g, v // 32] is set (bit 0 is the
        least significant) and becomes -inf otherwise; tokens v >= 32 * W are forbidden.
        Rows not named in `rows` are untouched; `rows` holds distinct indices into logits.

Penalties, forbidden tokens and logprobs are applied by the worker in plain torch around
these ops; they are not part of the table.

Fused ops (FUSED_OP_NAMES) are optional: each is defined as a composition of the ops above,
with the same results, and saves the launches and memory passes between them. A plugin may
register any of them; the worker asks `Platform.fused_op(name)` and composes the unfused ops
itself where the answer is None. The reference (cpu) plugin registers them all, as the
compositions that define them.

    rotary_store_kv(positions[T], q[T, Hq, D], k[T, Hk, D], v[T, Hk, D], cos_sin[P, D],
                    k_cache, v_cache, slots[T], *, k_scale=1.0, v_scale=1.0) -> q_out[T, Hq, D]
        q_out, k_rot = rotary_embedding(positions, q, k, cos_sin)
        store_kv(k_cache, v_cache, k_rot, v, slots, k_scale=..., v_scale=...)
        (rotary over the whole head dim; k_rot is rounded to k.dtype before it is stored,
        as the composition rounds it)
    silu_and_mul_linear(x[T, 2I], weight[Out, I], bias[Out] | None) -> [T, Out]
        linear(silu_and_mul(x), weight, bias): the gated MLP's activation as the down
        projection's prologue (the activation rounded to x.dtype, as the composition rounds
        it, before the product)
    moe_softmax_topk(logits[T, E], top_k, renormalize) -> (weights[T, K] float32,
                                                           ids[T, K] int32)
        a Mixture-of-Experts router's choice (not a composition of the ops above: of
        torch's): probs = softmax(logits.float()); weights, ids = topk(probs, top_k), the
        largest first (among equal probabilities the lower expert first); with renormalize,
        weights / weights.sum(-1). One launch where the torch ops are five or six, in every
        MoE layer of a decode step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

OP_NAMES: tuple[str, ...] = (
    "embedding",
    "rms_norm",
    "fused_add_rms_norm",
    "rotary_embedding",
    "silu_and_mul",
    "gelu_tanh_and_mul",
    "linear",
    "store_kv",
    "attention_extend",
    "attention_decode",
    "fused_moe",
    "sample",
    "apply_token_mask",
)
FUSED_OP_NAMES: tuple[str, ...] = (
    "rotary_store_kv",
    "silu_and_mul_linear",
    "moe_softmax_topk",
)


@dataclass
class SamplingTensors:
    """Per-row sampling parameters on the device, B rows each.

    all_greedy lets a plugin skip the random path when every row is greedy.
    offsets: tokens the request generated so far (the seeded stream's position).
    The host knows the parameters, so it may also say which filters any row uses: any_top_k
    (some top_k > 0), any_top_p (some top_p < 1), any_min_p (some min_p > 0) and max_top_k
    (the largest top_k, 0 if none). A plugin then needs no read-back from the device to choose
    its path; None means unknown (it may read the tensors). Each is a superset: a flag set
    for rows whose filter turns out to be off (top_k >= V) changes nothing but the work.
    """

    temperature: torch.Tensor  # float32 [B]
    top_p: torch.Tensor  # float32 [B]
    top_k: torch.Tensor  # int32 [B]
    min_p: torch.Tensor  # float32 [B]
    seeds: torch.Tensor  # int64 [B], -1 = unseeded
    offsets: torch.Tensor  # int64 [B]
    all_greedy: bool = False
    any_top_k: bool | None = None
    any_top_p: bool | None = None
    any_min_p: bool | None = None
    max_top_k: int | None = None
