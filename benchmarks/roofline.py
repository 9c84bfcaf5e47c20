"""The roofline bound of a run: how fast the steps it made could go at best on this device.

Per step, a forward pass must at least
  - read every weight once (bytes = all parameters x dtype size; BENCHMARKS.md's 16.06 GB);
    of a Mixture-of-Experts layer, only the experts the step's tokens chose (ModelCost),
  - read the KV cache of every request in the batch (sum of seq_lens x KV bytes per token),
  - do the matmul FLOPs (2 x matmul parameters x new tokens) and attention FLOPs
    (4 x q_size x layers x attended positions, causal within an extend),
so its time is at least max(bytes / bandwidth, FLOPs / peak). The bound of the run is the sum
over its steps; the bound in tokens/s is its output tokens over that time. On several devices
the bytes and FLOPs are shared out: the bandwidth and peak are the sum of the devices that work
at the same time (`parallel_devices`).

The steps come from the engine when it reports them, else from `simulate_steps`, which replays
the scheduler's policy (FCFS, decodes plus chunked prefill per step, at most max_running
requests).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tessera.formats.config import ModelConfig

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class ModelCost:
    """Byte and FLOP constants of one model at one dtype.

    Mixture-of-Experts: a step reads only the routed experts its tokens chose. With routing
    spread evenly (random weights), a step of T tokens reads on average
    E * (1 - (1 - k/E)^T) of the E experts of each MoE layer (`experts_read`); every token
    multiplies by k of them.
    """

    weight_bytes: float  # every parameter but the routed experts, once
    matmul_params: float  # parameters that multiply each new token (all but the embedding)
    kv_bytes_per_token: float  # K and V, every layer
    attn_flops_per_position: float  # per (query token, attended position) pair, all layers
    expert_bytes: float = 0.0  # one routed expert of every MoE layer
    num_experts: int = 0  # routed experts per MoE layer (0: a dense model)
    top_k: int = 0

    @classmethod
    def of(cls, config: ModelConfig, dtype: str = "bfloat16") -> ModelCost:
        from tessera.formats.layout import hf_tensor_shapes

        size = DTYPE_BYTES[dtype]
        params = embed = experts = 0
        for name, shape in hf_tensor_shapes(config).items():
            n = 1
            for dim in shape:
                n *= dim
            params += n
            if name == "model.embed_tokens.weight":
                embed = n
            elif ".experts." in name:
                experts += n
        moe = config.moe
        num_experts, top_k = (moe.num_experts, moe.top_k) if moe is not None else (0, 0)
        per_expert = experts / num_experts if num_experts else 0.0
        # With tied embeddings the table is also the LM head: it still multiplies every token.
        dense = params - experts
        matmul = (dense if config.tie_word_embeddings else dense - embed) + top_k * per_expert
        kv = 2 * config.num_layers * config.kv_size * size
        return cls(weight_bytes=float(dense * size), matmul_params=float(matmul),
                   kv_bytes_per_token=float(kv),
                   attn_flops_per_position=float(4 * config.q_size * config.num_layers),
                   expert_bytes=float(per_expert * size), num_experts=num_experts,
                   top_k=top_k)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def experts_read(self, tokens: int) -> float:
        """Expected routed experts a step of `tokens` tokens reads per MoE layer."""
        if not self.num_experts:
            return 0.0
        return self.num_experts * (1.0 - (1.0 - self.top_k / self.num_experts) ** tokens)

    def step_weight_bytes(self, tokens: int) -> float:
        return self.weight_bytes + self.expert_bytes * self.experts_read(tokens)


@dataclass(frozen=True)
class StepShape:
    """One forward step: per request, new tokens and tokens in KV after the step."""

    extend_lens: tuple[int, ...]
    seq_lens: tuple[int, ...]


@dataclass(frozen=True)
class Device:
    bandwidth_gbps: float  # GB/s (1e9 bytes)
    peak_tflops: float  # TFLOP/s (1e12)

    def times(self, count: int) -> Device:
        """`count` such devices working at once: their summed bandwidth and peak."""
        return Device(self.bandwidth_gbps * count, self.peak_tflops * count)


def parallel_devices(tp_size: int, pp_size: int, stages_overlap: bool) -> int:
    """How many devices' bandwidth and peak a run's bound may sum. A stage's tensor-parallel
    ranks read their shares of the weights and KV at the same time; the pipeline's stages work
    at the same time only when several batches are in flight (B2), not while one request
    decodes alone (B1), where they take turns."""
    return tp_size * (pp_size if stages_overlap else 1)


@dataclass(frozen=True)
class RooflineResult:
    bound_s: float
    memory_s: float  # sum over steps of the memory time alone
    compute_s: float  # sum over steps of the compute time alone
    steps: int
    bytes_read: float
    flops: float

    def tok_per_s(self, output_tokens: int) -> float:
        return output_tokens / self.bound_s if self.bound_s > 0 else float("inf")


def step_cost(cost: ModelCost, step: StepShape) -> tuple[float, float]:
    """(bytes, flops) of one step."""
    tokens = sum(step.extend_lens)
    kv_read = sum(step.seq_lens) * cost.kv_bytes_per_token
    positions = 0
    for ext, seq in zip(step.extend_lens, step.seq_lens, strict=True):
        # new tokens attend to seq-ext cached positions plus 1..ext causally
        positions += ext * (seq - ext) + ext * (ext + 1) // 2
    flops = 2 * cost.matmul_params * tokens + cost.attn_flops_per_position * positions
    return cost.step_weight_bytes(tokens) + kv_read, flops


def roofline(cost: ModelCost, steps: Iterable[StepShape], device: Device) -> RooflineResult:
    bw = device.bandwidth_gbps * 1e9
    peak = device.peak_tflops * 1e12
    bound = mem = comp = total_bytes = total_flops = 0.0
    n = 0
    for step in steps:
        nbytes, flops = step_cost(cost, step)
        m, c = nbytes / bw, flops / peak
        bound += max(m, c)
        mem += m
        comp += c
        total_bytes += nbytes
        total_flops += flops
        n += 1
    return RooflineResult(bound, mem, comp, n, total_bytes, total_flops)


def roofline_from_totals(cost: ModelCost, steps: int, new_tokens: int, kv_tokens_read: int,
                         attended_positions: int, device: Device) -> RooflineResult:
    """The bound from an engine's step counters alone (no per-step shapes): memory and compute
    time summed over the run, bound = the larger. This is never above the per-step bound
    (sum of max >= max of sums), so tokens/s against it is a stricter test. Not for
    Mixture-of-Experts models: the experts a step reads depend on its own token count."""
    if cost.is_moe:
        raise ValueError("a Mixture-of-Experts bound needs the steps' shapes (roofline())")
    nbytes = steps * cost.weight_bytes + kv_tokens_read * cost.kv_bytes_per_token
    flops = 2 * cost.matmul_params * new_tokens + cost.attn_flops_per_position * attended_positions
    mem = nbytes / (device.bandwidth_gbps * 1e9)
    comp = flops / (device.peak_tflops * 1e12)
    return RooflineResult(max(mem, comp), mem, comp, steps, nbytes, flops)


def micro_batches(steps: Sequence[StepShape], parts: int) -> list[StepShape]:
    """The steps as a pipeline runs them: each step's requests dealt round-robin into `parts`
    independent batches (the scheduler spreads the decoding requests over the batches in
    flight), every batch reading the weights again."""
    if parts <= 1:
        return list(steps)
    out: list[StepShape] = []
    for step in steps:
        pairs = list(zip(step.extend_lens, step.seq_lens, strict=True))
        for i in range(min(parts, len(pairs))):
            share = pairs[i::parts]
            out.append(StepShape(tuple(e for e, _ in share), tuple(q for _, q in share)))
    return out


def simulate_steps(prompt_lens: Sequence[int], output_lens: Sequence[int], max_running: int,
                   chunk_size: int = 2048, kv_capacity: int | None = None,
                   mixed: bool = True) -> list[StepShape]:
    """The steps a continuous-batching scheduler makes when every request arrives at once.

    mixed=True (tessera's scheduler): each step decodes every running request whose prompt is
    in KV, plus prefill chunks (earlier admissions first, then new requests, FCFS) under a
    budget of chunk_size prompt tokens. mixed=False (SGLang's default): a step is either a
    prefill step, when prefill work is possible, or a decode step. A request's last prefill
    chunk samples its first output token. Admission stops at max_running requests or when the
    request at its full length would not fit in kv_capacity token slots."""
    n = len(prompt_lens)
    waiting = deque(range(n))
    kv: dict[int, int] = {}  # admitted request -> tokens in KV (insertion order = admission)
    prefill_left: dict[int, int] = {}
    out_left: dict[int, int] = {}
    chunk = chunk_size if chunk_size > 0 else 1 << 62
    steps: list[StepShape] = []
    reserved = 0  # slots of admitted requests at their full length (no retraction modelled)
    while waiting or kv:
        ext: list[int] = []
        seq: list[int] = []
        budget = chunk
        prefills: list[tuple[int, int]] = []
        for r, left in prefill_left.items():
            if budget <= 0:
                break
            take = min(budget, left)
            prefills.append((r, take))
            budget -= take
        while waiting and budget > 0 and len(kv) < max_running:
            r = waiting[0]
            need = prompt_lens[r] + output_lens[r]
            if kv_capacity is not None and (reserved + need > kv_capacity or not kv and
                                            prompt_lens[r] > kv_capacity):
                break
            reserved += need
            waiting.popleft()
            kv[r] = 0
            prefill_left[r] = prompt_lens[r]
            take = min(budget, prompt_lens[r])
            prefills.append((r, take))
            budget -= take
        decodes = [r for r in kv if r not in prefill_left and out_left.get(r, 0) > 0]
        if not mixed and prefills:
            decodes = []
        elif not mixed:
            prefills = []
        if not prefills and not decodes:
            break  # nothing can run (a prompt larger than the KV capacity)
        for r in decodes:
            kv[r] += 1
            out_left[r] -= 1
            ext.append(1)
            seq.append(kv[r])
        for r, take in prefills:
            kv[r] += take
            prefill_left[r] -= take
            ext.append(take)
            seq.append(kv[r])
            if prefill_left[r] == 0:
                del prefill_left[r]
                out_left[r] = output_lens[r] - 1  # the last chunk sampled the first token
        steps.append(StepShape(tuple(ext), tuple(seq)))
        for r in [r for r, left in out_left.items() if left <= 0]:
            del out_left[r], kv[r]
            reserved -= prompt_lens[r] + output_lens[r]
    return steps
