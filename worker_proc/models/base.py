"""CausalLM: what every model shares — its build context, the embedding, final norm and LM
head, and checkpoint loading.

A model is built on the meta device; each parameter is materialized on the real device when
its first checkpoint tensor streams in (`load_weights`), so loading never holds two copies of
the model. A pipeline stage builds and reads only its own layers, the embedding on the first
stage, the final norm and LM head on the last (`checkpoint_wanted`). Every checkpoint tensor (Hugging Face names, `formats/layout.py`) has one or more
`Target`s — the layer that takes it and which fused part it is — and the layer copies this
rank's share of it (`layers/linear.py` holds the tensor-parallel layout).
"""

from __future__ import annotations

import re
from abc import abstractmethod
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn

from tessera.formats.config import ModelConfig
from tessera.formats.errors import ModelFormatError, WeightShapeError
from tessera.formats.layout import hf_tensor_shapes
from tessera.formats.parallel import StageLayers
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


_LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.")


class CausalLM(nn.Module):
    """Subclasses build their layers in __init__ (after super().__init__), the layers of
    `self.stage.layers` only, and define `layer_targets` and `hidden` (which starts from
    `stage_input`); `forward` is `hidden` then `logits`, which a captured prefill step runs
    apart (worker_proc/graph_mixed.py: the graph ends at the hidden states, the vocabulary
    matmul runs for the sampled rows only)."""

    def __init__(self, config: ModelConfig, platform: Platform, *, dtype: torch.dtype,
                 device: torch.device, max_positions: int, tp_rank: int = 0, tp_size: int = 1,
                 communicator: Communicator | None = None, ep_size: int = 1,
                 quant: QuantPlan | None = None, stage: StageLayers | None = None) -> None:
        super().__init__()
        self.config = config
        self.tp = TPShape.of(config, tp_rank, tp_size, ep_size)
        self.stage = stage or StageLayers.of(config.num_layers, 1, 0)
        self.ctx = ModelContext(config, platform, self.tp, dtype, device, max_positions,
                                communicator, quant, self.stage)
        self.dtype, self.device, self.max_positions = dtype, device, max_positions
        # One rank holding the whole model shares the embedding table as a tied head; a TP
        # rank or the last pipeline stage keeps a (sharded) copy of it instead, and so does a
        # head quantized at load (the lookup keeps the table in the serving dtype).
        self.shares_table = config.tie_word_embeddings and tp_size == 1 and \
            self.stage.is_first and self.stage.is_last and (quant is None or not quant.lm_head)
        self.embed = VocabEmbedding(self.ctx, config.vocab_size, config.hidden_size) \
            if self.stage.is_first else None
        self.final_norm = RMSNorm(self.ctx, config.hidden_size, config.rms_norm_eps,
                                  unit_offset=self.norm_unit_offset) \
            if self.stage.is_last else None
        self.lm_head = LMHead(self.ctx, config.vocab_size, config.hidden_size,
                              shares_table=self.shares_table) if self.stage.is_last else None
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

    def forward(self, inp: ForwardInputs, kv: KVArena, *, float32: bool = True) -> torch.Tensor:
        """float32 logits [S, vocab] for the tokens at inp.logits_indices (float32=False:
        see `logits`)."""
        h, residual = self.hidden(inp, kv)
        return self.logits(h, residual, inp, float32=float32)

    def checkpoint_targets(self) -> Targets:
        c = self.config
        out = self.layer_targets()
        if self.embed is not None:
            add_target(out, "model.embed_tokens.weight", Target(self.embed))
        if self.final_norm is not None and self.lm_head is not None:
            add_target(out, "model.norm.weight", Target(self.final_norm))
            if not c.tie_word_embeddings:
                add_target(out, "lm_head.weight", Target(self.lm_head))
            elif not self.shares_table:
                # The head is a (sharded) copy of the embedding table (see shares_table).
                add_target(out, "model.embed_tokens.weight", Target(self.lm_head))
        return out

    def checkpoint_wanted(self, name: str) -> bool:
        """Whether this rank reads checkpoint tensor `name`: everything but another pipeline
        stage's layers, and the embedding / final norm / LM head where no stage part of this
        one takes them."""
        match = _LAYER_NAME.match(name)
        if match is not None:
            return int(match.group(1)) in self.stage
        if name == "model.embed_tokens.weight":
            return self.stage.is_first or (self.stage.is_last and
                                           self.config.tie_word_embeddings)
        if name in ("model.norm.weight", "lm_head.weight"):
            return self.stage.is_last
        return True

    def load_weights(self, tensors: Iterable[tuple[str, torch.Tensor | QuantizedWeight]]
                     ) -> None:
        """Copy HF-named full tensors into this rank's (sharded, fused) parameters. Raises
        WeightShapeError on a shape the config does not imply, ModelFormatError on a tensor
        that is missing or unknown."""
        c = self.config
        expected = {n: shape for n, shape in hf_tensor_shapes(c).items()
                    if self.checkpoint_wanted(n)}
        targets = self.checkpoint_targets()
        seen: set[str] = set()
        for name, tensor in tensors:
            if name not in expected:
                if name == "lm_head.weight" and c.tie_word_embeddings:
                    continue  # some tied checkpoints store the head anyway
                if not self.checkpoint_wanted(name):
                    continue  # another pipeline stage's
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
        if self.shares_table:
            assert self.lm_head is not None and self.embed is not None
            self.lm_head.tie(self.embed)
        for module in self.modules():
            finish = getattr(module, "finish_loading", None)
            if finish is not None:
                finish()
        still_meta = [n for n, p in self.named_parameters() if p.is_meta]
        if still_meta:
            raise ModelFormatError(f"parameters never loaded: {', '.join(still_meta[:5])}")

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        if self.embed is None:
            raise RuntimeError(f"pipeline stage {self.stage.stage} has no embedding: it starts "
                               f"from the previous stage's hidden states")
        h = self.embed(ids)
        return h * self.embed_scale if self.embed_scale != 1.0 else h

    def stage_input(self, inp: ForwardInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The first layer's (input, residual): the embedded tokens on the first stage, the
        previous stage's output on a later one."""
        if inp.hidden_in is not None:
            return inp.hidden_in, inp.residual_in
        return self.embed_tokens(inp.input_ids), None

    def layer_prefixes(self) -> list[tuple[int, nn.Module]]:
        """(model layer index, module) of this stage's decoder layers."""
        layers = getattr(self, "layers", [])
        return list(zip(self.stage.layers, layers, strict=True))

    def normed(self, h: torch.Tensor, residual: torch.Tensor | None,
               idx: torch.Tensor) -> torch.Tensor:
        """The final hidden states (after the last norm, as transformers' last_hidden_state)
        of the tokens at `idx`."""
        assert self.final_norm is not None, "only the last pipeline stage has the final norm"
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
               inp: ForwardInputs, *, float32: bool = True) -> torch.Tensor:
        """Final norm and LM head, only at the sampled positions (the vocabulary matmul is
        large), then the config's logit scaling or soft-capping; float32 [S, vocab].
        float32=False: the LM head's own output (the model's dtype, the values its float32
        copy would hold) where the config scales nothing, for a caller that converts only
        when it must (a decode graph's logits: at 256 rows of a 128k vocabulary the float32
        copy is 130 MB written a step)."""
        if self.final_norm is None or self.lm_head is None:
            raise RuntimeError(f"pipeline stage {self.stage.stage} computes no logits: the last "
                               f"stage does")
        raw = self.lm_head(self.normed(h, residual, inp.logits_indices))
        c = self.config
        if not float32 and c.logits_scaling == 1.0 and c.final_logit_softcap <= 0:
            return raw  # type: ignore[no-any-return]
        logits = raw.float()
        if c.logits_scaling != 1.0:
            logits = logits / c.logits_scaling
        if c.final_logit_softcap > 0:
            logits = torch.tanh(logits / c.final_logit_softcap) * c.final_logit_softcap
        return logits  # type: ignore[no-any-return]
