"""--speculative-algorithm draft: a smaller model with the target's vocabulary proposes tokens.

Every worker rank loads it beside the target (the same plugin, dtype, tensor parallelism and
--load-format) with a KV arena of its own that has the target's slots: the scheduler's page
table serves both, so the radix cache, chunked prefill and retraction need nothing more. The
draft's KV is written for exactly the positions the target's is, which keeps it complete:

  1. every step, the draft runs the step's tokens except the placeholders of proposals (the
     prefill chunks, every decode's input), which writes their KV and, for each request asked
     for d proposals, gives the logits of its first;
  2. then d - 1 one-token steps of the requests still drafting, each proposing the next
     token (greedy: the proposal is certain, as verify.py requires), and one more that
     writes the KV of the last proposal;
  3. the proposals are written into the target's input ids on the device, in place of the
     placeholders the scheduler sent, before the target's forward verifies them.
Proposals the target rejects leave KV in slots that the next tokens at those positions
overwrite (the scheduler rolls the KV length back). Decode steps of the draft replay
captured graphs where the plugin captures (the same DecodeGraphs / MixedGraphs as the
target's).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from tessera.bus.messages import ForwardBatch
from tessera.formats import open_model
from tessera.formats.dummy import DummyFiles
from tessera.hal.platform import KVArena, Platform
from tessera.worker_proc.forward_inputs import (
    ForwardInputs,
    build_forward_inputs,
    table_rows,
    to_device,
)
from tessera.worker_proc.models import model_class
from tessera.worker_proc.quant_plan import plan_quantization

if TYPE_CHECKING:
    from tessera.worker_proc.model_runner import ModelRunner

log = logging.getLogger(__name__)


class DraftModel:
    def __init__(self, runner: ModelRunner) -> None:
        cfg = runner.config
        assert cfg.speculative_draft_model is not None
        start = time.perf_counter()
        self.runner = runner
        self.platform = runner.platform
        self.device = runner.device
        self.files = open_model(cfg.speculative_draft_model, cfg.load_format, cfg.seed)
        mc = self.files.config
        target_vocab = runner.model_config.vocab_size
        if mc.vocab_size > target_vocab:
            raise ValueError(f"--speculative-draft-model {cfg.speculative_draft_model}: its "
                             f"vocabulary ({mc.vocab_size} ids) is larger than the target's "
                             f"({target_vocab}); the draft model must share the target's "
                             f"tokenizer")
        self.quant = plan_quantization("auto", self.files, runner.platform)
        self.model = model_class(mc.arch)(
            mc, runner.platform, dtype=runner.dtype, device=self.device,
            max_positions=runner.max_context_len, tp_rank=runner.rank, tp_size=cfg.tp_size,
            communicator=runner.communicator, ep_size=cfg.ep_size, quant=self.quant)
        if isinstance(self.files, DummyFiles):
            self.files.device = self.device
        self.model.load_weights(self.files.iter_tensors(
            runner.dtype, keep_quantized=self.quant.keep_checkpoint))
        tp = self.model.tp
        self.model_config = mc
        self.bytes_per_slot = KVArena.bytes_per_slot(mc.num_layers, tp.num_kv_heads,
                                                     mc.head_dim, runner.dtype)
        self.weight_bytes = self.model.weight_bytes()
        self.kv: Any = None
        self.graphs: Any = None
        self.mixed_graphs: Any = None
        log.info("rank %d: loaded the draft model %s (%s, %.1f MiB) in %.1fs", runner.rank,
                 cfg.speculative_draft_model, mc.arch, self.weight_bytes / 2**20,
                 time.perf_counter() - start)

    def create_arena(self, num_slots: int) -> None:
        mc = self.model_config
        self.kv = self.runner.platform.create_kv_arena(
            mc.num_layers, num_slots, self.model.tp.num_kv_heads, mc.head_dim,
            self.runner.dtype)

    def capture_graphs(self, decode_graphs: Any, mixed_graphs: Any) -> None:
        """Graphs of the draft's steps, where the target has them (`decode_graphs` /
        `mixed_graphs`: factories taking the forward functions)."""
        self.graphs = decode_graphs(lambda inp: self.model(inp, self.kv))
        self.mixed_graphs = mixed_graphs(lambda inp: self.model.hidden(inp, self.kv),
                                         self.model.logits)

    # -- one step ---------------------------------------------------------------------------

    def _forward(self, inputs: ForwardInputs) -> torch.Tensor:
        if inputs.is_decode and self.graphs is not None and self.graphs.can_run(inputs):
            return self.graphs.run(inputs)  # type: ignore[no-any-return]
        if self.mixed_graphs is not None and self.mixed_graphs.can_run(inputs):
            return self.mixed_graphs.run(inputs)  # type: ignore[no-any-return]
        return self.model(inputs, self.kv)  # type: ignore[no-any-return]

    def step(self, batch: ForwardBatch, inputs: ForwardInputs,
             req_to_token: np.ndarray) -> None:
        """Write the draft's KV for the step's tokens and its proposals into inputs.input_ids
        (the target's, on the device; negative ids already resolved)."""
        with torch.inference_mode():
            if batch.draft_lens.shape[0] and batch.draft_lens.any():
                self._propose(batch, inputs, req_to_token)
            elif self.graphs is not None or self.mixed_graphs is not None:
                self._forward(inputs)  # for the KV (a replay computes the logits too)
            else:
                self.model.hidden(inputs, self.kv)  # for the KV

    def _propose(self, batch: ForwardBatch, inputs: ForwardInputs,
                 req_to_token: np.ndarray) -> None:
        drafts = np.asarray(batch.draft_lens, dtype=np.int64)
        extend = np.asarray(batch.extend_lens, dtype=np.int64)
        seq_lens = np.asarray(batch.seq_lens, dtype=np.int64)
        ends = np.cumsum(extend)
        # 1. the step without the placeholders; logits after each drafting request's input
        keep = np.ones(int(ends[-1]), dtype=bool)
        for i in np.flatnonzero(drafts).tolist():
            keep[ends[i] - drafts[i]:ends[i]] = False
        base = dataclasses.replace(
            batch, seq_lens=(seq_lens - drafts).astype(np.int32),
            extend_lens=(extend - drafts).astype(np.int32),
            input_ids=np.asarray(batch.input_ids)[keep],
            sample=(drafts > 0).astype(np.uint8), draft_lens=np.zeros(0, np.int32),
            prompt_targets=np.zeros(0, np.int32), is_decode=False)
        platform, device = self.platform, self.device
        base_inputs = build_forward_inputs(base, req_to_token, platform, device)
        base_inputs.input_ids = inputs.input_ids[to_device(platform, np.flatnonzero(keep),
                                                           torch.int64, device)]
        base_inputs.has_last_sampled = False  # the target's inputs have them resolved
        proposals = self._argmax(self._forward(base_inputs))  # [R]: each request's next
        # 2. one token at a time: proposal j + 1 of the requests with more than j
        reqs = np.flatnonzero(drafts)
        rows = np.asarray(batch.rows, dtype=np.int64)[reqs]
        d = drafts[reqs]
        first_pos = seq_lens[reqs] - d  # position of each request's first proposal
        first_tok = ends[reqs] - d  # and its index among the step's input ids
        rounds = int(d.max())
        for j in range(rounds):
            live = np.flatnonzero(d > j)
            live_dev = to_device(platform, live, torch.int64, device)
            ids = proposals[live_dev]
            inputs.input_ids[to_device(platform, first_tok[live] + j, torch.int64, device)] = ids
            logits = self._forward(_decode_inputs(rows[live], first_pos[live] + j,
                                                  req_to_token, platform, device, ids))
            if j + 1 < rounds:  # the last round only writes the last proposal's KV
                proposals[live_dev] = self._argmax(logits)

    @staticmethod
    def _argmax(logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(dim=-1).to(torch.int64)


def _decode_inputs(rows: np.ndarray, positions: np.ndarray, req_to_token: np.ndarray,
                   platform: Platform, device: torch.device, ids: torch.Tensor
                   ) -> ForwardInputs:
    """One token per row at `positions` (its slot from the page table), attending to every
    position up to it."""
    n = int(rows.shape[0])
    seq_lens = positions + 1
    table = table_rows(req_to_token, rows, seq_lens)
    slots = req_to_token[rows, positions].astype(np.int64)

    def dev(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return to_device(platform, a, dtype, device)

    return ForwardInputs(
        input_ids=ids, token_rows=dev(rows, torch.int64), positions=dev(positions, torch.int64),
        out_slots=dev(slots, torch.int64), req_to_token=dev(table, torch.int32),
        seq_lens=dev(seq_lens, torch.int32), extend_lens=dev(np.ones(n, np.int64), torch.int32),
        qo_indptr=dev(np.arange(n + 1), torch.int32),
        logits_indices=dev(np.arange(n), torch.int64), is_decode=True, max_extend_len=1)
