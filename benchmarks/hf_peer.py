"""The peer: Hugging Face transformers `generate` on the same model, one request at a time.

A real model (the default GGUF, a HF folder) is built from tessera's own reader, so both
engines run the very same (dequantized) weights and nothing needs `accelerate` or a hub:
the HF model is made from `ModelConfig.to_hf_dict()` and given the tensors `formats` yields.
A `--load-format dummy` model gets transformers' own random initialisation on the device
(for a speed baseline the values do not matter, and an 8B model is not copied twice).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PeerRun:
    output_tokens: int  # over the whole batch
    seconds: float
    ttft_s: float  # prefill + first token (batch 1 only; NaN otherwise)
    token_ids: list[int]  # of the first prompt
    steps: int = 0  # new tokens per prompt

    @property
    def decode_ms_per_step(self) -> float:
        if self.steps < 2 or self.ttft_s != self.ttft_s:
            return self.seconds / max(1, self.steps) * 1000.0
        return (self.seconds - self.ttft_s) / (self.steps - 1) * 1000.0


def load_peer(model: str, load_format: str, dtype: str, device: str, seed: int = 0) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tessera.formats import open_model

    files = open_model(model, load_format, seed)
    hf = files.config.to_hf_dict()
    config = AutoConfig.for_model(hf.pop("model_type"), **hf)
    torch_dtype = getattr(torch, dtype)
    with torch.device(device):
        peer = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    if files.kind != "dummy":
        state = {name: t.to(device) for name, t in files.iter_tensors(torch_dtype)}
        missing, unexpected = peer.load_state_dict(state, strict=False)
        # lm_head is absent from a checkpoint with tied embeddings: tie_weights fills it.
        if unexpected or [m for m in missing if m != "lm_head.weight"]:
            raise RuntimeError(f"peer weights do not match: missing {missing}, "
                               f"unexpected {unexpected}")
        peer.tie_weights()
    return peer.eval()


def generate(peer: Any, prompts: list[list[int]], max_new_tokens: int) -> PeerRun:
    """Greedy, exactly max_new_tokens per prompt (EOS ignored), timed. Several prompts run as
    one batch and must have the same length (no padding). TTFT is the time of the first
    generated token, seen by a streamer (a second, 1-token generate would prefill twice)."""
    import torch
    from transformers.generation.streamers import BaseStreamer

    class FirstToken(BaseStreamer):
        def __init__(self) -> None:
            self.calls = 0
            self.first: float | None = None

        def put(self, value: Any) -> None:
            self.calls += 1
            if self.calls == 2 and self.first is None:  # call 1 is the prompt
                self.first = time.perf_counter()

        def end(self) -> None:
            pass

    if len({len(p) for p in prompts}) != 1:
        raise ValueError("a peer batch needs prompts of one length (no padding)")
    device = next(peer.parameters()).device
    ids = torch.tensor(prompts, device=device)
    streamer = FirstToken() if len(prompts) == 1 else None  # streamers take batch 1 only
    _sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = peer.generate(ids, attention_mask=torch.ones_like(ids),
                            max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                            do_sample=False, streamer=streamer, pad_token_id=0)
    _sync(device)
    seconds = time.perf_counter() - t0
    new = out[:, ids.shape[1]:]
    first = streamer.first if streamer is not None else None
    ttft = (first - t0) if first is not None else float("nan")
    return PeerRun(int(new.numel()), seconds, ttft, new[0].tolist(), int(new.shape[1]))


def _sync(device: Any) -> None:
    import torch

    if getattr(device, "type", "cpu") == "cuda":
        torch.cuda.synchronize()
