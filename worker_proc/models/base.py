"""CausalLM: what every model shares — its build context, the embedding, final norm and LM
head, and checkpoint loading.

A model is built on the meta device; each parameter is materialized on the real device when
its first checkpoint tensor streams in (`load_weights`), so loading never holds two copies of
the model. Every checkpoint tensor (Hugging Face names, `formats/layout.py`) has one or more
`Target`s — the layer that takes it and which fused part it is — and the layer copies this
rank's share of it (`layers/linear.py` holds the tensor-parallel layout).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn

from tessera.formats.config import ModelConfig
from tessera.formats.errors import ModelFormatError, WeightShapeError
from tessera.formats.layout import hf_tensor_shapes
from tessera.hal.platform import Communicator, KVArena, Platform
from tessera.worker_proc.forward_inputs import ForwardInputs
from tessera.worker_proc.models.context import ModelContext
from tessera.worker_proc.models.layers import (
    Linear,
    LMHead,
    RMSNorm,
    Target,
    Targets,
    VocabEmbedding,
    add_target,
)
from tessera.worker_proc.tp import TPShape

if TYPE_CHECKING:
    from tessera.hal.quant import QuantizedWeight
    from tessera.worker_proc.quant_plan import QuantPlan


class CausalLM(nn.Module):
    """Subclasses build their layers in __init__ (after super().__init__) and define
    `layer_targets` and `hidden`; `forward` is `hidden` then `logits`, which a captured
    prefill step runs apart (worker_proc/graph_mixed.py: the graph ends at the hidden states,
    the vocabulary matmul runs for the sampled rows only)."""

    def __init__(self, config: ModelConfig, platform: Platform, *, dtype: torch.dtype,
                 device: torch.device, max_positions: int, tp_rank: int = 0, tp_size: int = 1,
                 communicator: Communicator | None = None, ep_size: int = 1,
                 quant: QuantPlan | None = None) -> None:
        super().__init__()
        self.config = config
        self.tp = TPShape.of(config, tp_rank, tp_size, ep_size)
        self.ctx = ModelContext(config, platform, self.tp, dtype, device, max_positions,
                                communicator, quant)
        self.dtype, self.device, self.max_positions = dtype, device, max_positions
        self.embed = VocabEmbedding(self.ctx, config.vocab_size, config.hidden_size)
        self.final_norm = RMSNorm(self.ctx, config.hidden_size, config.rms_norm_eps,
                                  unit_offset=self.norm_unit_offset)
        self.lm_head = LMHead(self.ctx, config.vocab_size, config.hidden_size)
        # The embedding scale as transformers applies it: a tensor in the serving dtype.
        self.embed_scale = float(torch.tensor(config.embedding_scale, dtype=dtype))

    norm_unit_offset = False  # Gemma's norms scale by (1 + w)

    @abstractmethod
    def layer_targets(self) -> Targets:
        """The checkpoint tensors of the decoder layers and where they go."""

    @abstractmethod
    def hidden(self, inp: ForwardInputs, kv: KVArena) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The last decoder layer's output and residual stream for every token [T, hidden]
        (residual None if the model folds it in), before the final norm."""

    def forward(self, inp: ForwardInputs, kv: KVArena) -> torch.Tensor:
        """float32 logits [S, vocab] for the tokens at inp.logits_indices."""
        h, residual = self.hidden(inp, kv)
        return self.logits(h, residual, inp)

    def checkpoint_targets(self) -> Targets:
        c = self.config
        out = self.layer_targets()
        add_target(out, "model.embed_tokens.weight", Target(self.embed))
        add_target(out, "model.norm.weight", Target(self.final_norm))
        if not c.tie_word_embeddings:
            add_target(out, "lm_head.weight", Target(self.lm_head))
        elif self.tp.size > 1:
            # One rank shares the embedding as the head (tie()); several shard a copy of it.
            add_target(out, "model.embed_tokens.weight", Target(self.lm_head))
        return out

    def load_weights(self, tensors: Iterable[tuple[str, torch.Tensor | QuantizedWeight]]
                     ) -> None:
        """Copy HF-named full tensors into this rank's (sharded, fused) parameters. Raises
        WeightShapeError on a shape the config does not imply, ModelFormatError on a tensor
        that is missing or unknown."""
        c = self.config
        expected = hf_tensor_shapes(c)
        targets = self.checkpoint_targets()
        seen: set[str] = set()
        for name, tensor in tensors:
            if name not in expected:
                if name == "lm_head.weight" and c.tie_word_embeddings:
                    continue  # some tied checkpoints store the head anyway
                raise ModelFormatError(
                    f"tensor {name!r} is not part of a {c.arch} model with this config "
                    f"(qkv_bias={c.qkv_bias}, qk_norm={c.qk_norm}); does config.json match "
                    f"the weights?")
            if tuple(tensor.shape) != expected[name]:
                raise WeightShapeError(
                    f"tensor {name!r} has shape {tuple(tensor.shape)} but the model config "
                    f"implies {expected[name]}; does config.json match the weights?")
            if name not in targets:
                raise ModelFormatError(f"the {c.arch} model has no place for tensor {name!r}")
            for target in targets[name]:
                if isinstance(target.module, Linear | LMHead) or isinstance(tensor, torch.Tensor):
                    target.load(tensor)
                else:  # a quantized checkpoint tensor for a layer without a quantized path
                    target.load(tensor.dequantize(self.dtype))
            seen.add(name)
        missing = sorted(set(expected) - seen)
        if missing:
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise ModelFormatError(f"the checkpoint lacks {len(missing)} tensor(s): "
                                   f"{', '.join(missing[:5])}{more}")
        if c.tie_word_embeddings and self.tp.size == 1:
            self.lm_head.tie(self.embed)
        for module in self.modules():
            finish = getattr(module, "finish_loading", None)
            if finish is not None:
                finish()
        still_meta = [n for n, p in self.named_parameters() if p.is_meta]
        if still_meta:
            raise ModelFormatError(f"parameters never loaded: {', '.join(still_meta[:5])}")

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        return h * self.embed_scale if self.embed_scale != 1.0 else h

    def normed(self, h: torch.Tensor, residual: torch.Tensor | None,
               idx: torch.Tensor) -> torch.Tensor:
        """The final hidden states (after the last norm, as transformers' last_hidden_state)
        of the tokens at `idx`."""
        if residual is None:
            return self.final_norm(h.index_select(0, idx))  # type: ignore[no-any-return]
        out, _ = self.final_norm.add_forward(h.index_select(0, idx),
                                             residual.index_select(0, idx))
        return out  # type: ignore[no-any-return]

    def weight_bytes(self) -> int:
        """Bytes of every parameter and buffer (a tied table counted once)."""
        seen, total = set(), 0
        for t in list(self.parameters()) + list(self.buffers()):
            if t.is_meta or t.data_ptr() in seen:
                continue
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
        return total

    def set_kv_cache_scales(self, scales: dict[int, tuple[float, float]]) -> None:
        """Store and read the KV cache as fp8 with these per-layer (k_scale, v_scale)
        (1.0 for a layer not named)."""
        from tessera.worker_proc.models.layers.attention import Attention

        for module in self.modules():
            if isinstance(module, Attention):
                module.kv_scales = scales.get(module.layer_index, (1.0, 1.0))

    def logits(self, h: torch.Tensor, residual: torch.Tensor | None,
               inp: ForwardInputs) -> torch.Tensor:
        """Final norm and LM head, only at the sampled positions (the vocabulary matmul is
        large), then the config's logit scaling or soft-capping; float32 [S, vocab]."""
        logits = self.lm_head(self.normed(h, residual, inp.logits_indices)).float()
        c = self.config
        if c.logits_scaling != 1.0:
            logits = logits / c.logits_scaling
        if c.final_logit_softcap > 0:
            logits = torch.tanh(logits / c.final_logit_softcap) * c.final_logit_softcap
        return logits  # type: ignore[no-any-return]
