"""The GPU run's harness (tests/hal_cuda/gpu_run.py): a minimal stand-in for the scheduler
(pages of 16, a request-to-token table, chunked prefill, a shared prefix) that drives the
worker's real model code; transformers' Llama on the same weights; random weights on device.
"""

from __future__ import annotations

import math
import time
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
