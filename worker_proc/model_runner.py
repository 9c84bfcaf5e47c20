"""ModelRunner: one worker's share of the model (its tensor-parallel slice of its pipeline
stage's layers), KV arena and sampler. `step` runs one ForwardBatch.

Mixed batches (prefill chunks and decodes together) run as one ragged forward through
`attention_extend`; a batch of only decodes goes through `attention_decode`. On a plugin that
captures graphs, both replay graphs captured at start-up: decodes at their padded batch size
(`worker_proc/graph_decode.py`), other steps of up to --graph-max-tokens tokens at their
padded token count (`worker_proc/graph_mixed.py`). With --pp-size > 1 every step goes through
the latter (a stage that is not the last ends at its hidden states, which it sends on: no
logits), and a later stage starts from what the previous one sent (`worker_proc/pipeline.py`).
The chip is reached only through the Platform contract.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from tessera.bus.messages import (
    ForwardBatch,
    GrammarInit,
    GrammarReady,
    SampledTokens,
    WorkerReady,
)
from tessera.codes import GRAPH_CAPTURE_FAILED, coded
from tessera.config import EngineConfig
from tessera.formats import ModelFiles, open_model
from tessera.formats.dummy import DummyFiles
from tessera.formats.hf_folder import HFFolderFiles
from tessera.hal.platform import Communicator, GraphRunner, KVArena, Platform
from tessera.worker_proc.capture_plan import decode_batch_limit, mixed_token_limit, quiet_gc
from tessera.worker_proc.forward_inputs import ForwardInputs, build_forward_inputs, to_device
from tessera.worker_proc.grammar.runtime import GrammarRuntime
from tessera.worker_proc.graph_decode import DecodeGraphs
from tessera.worker_proc.graph_mixed import MixedGraphs
from tessera.worker_proc.kv_sizing import KVPlan, plan_kv
from tessera.worker_proc.models import model_class
from tessera.worker_proc.parallel import RankLayout
from tessera.worker_proc.pipeline import PipelineLink
from tessera.worker_proc.pooling import pool_hidden, wants_pooling
from tessera.worker_proc.prompt_scores import PromptScores, score, with_score_rows
from tessera.worker_proc.quant_plan import plan_quantization
from tessera.worker_proc.sampler import DeviceSample, Sampler
from tessera.worker_proc.verify import VerifiedSample, accept, plan_verify

if TYPE_CHECKING:
    from tessera.worker_proc.draft_model import DraftModel

log = logging.getLogger(__name__)

_NO_RANGE = contextlib.nullcontext()


def _no_range(name: str) -> contextlib.AbstractContextManager[None]:
    return _NO_RANGE


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def kv_cache_dtype(config: EngineConfig, platform: Platform, dtype: torch.dtype
                   ) -> torch.dtype:
    """The KV arena's dtype: the serving dtype, or fp8 where asked and declared."""
    if config.kv_cache_dtype == "auto":
        return dtype
    if config.kv_cache_dtype not in platform.capabilities.kv_cache_dtypes:
        raise ValueError(f"--kv-cache-dtype {config.kv_cache_dtype} is not supported by the "
                         f"{platform.name} plugin (it declares "
                         f"{', '.join(platform.capabilities.kv_cache_dtypes) or 'none'}); "
                         f"use --kv-cache-dtype auto")
    return torch.float8_e4m3fn


def serving_dtype(config: EngineConfig, platform: Platform) -> torch.dtype:
    name = platform.capabilities.default_dtype if config.dtype == "auto" else config.dtype
    if name not in platform.capabilities.dtypes:
        raise ValueError(f"--dtype {name} is not supported by the {platform.name} plugin; "
                         f"it supports {', '.join(platform.capabilities.dtypes)}")
    return _DTYPES[name]


@dataclass
class PendingStep:
    """A launched step (ModelRunner.launch) whose result has not been fetched yet."""

    step: int
    sample: DeviceSample | VerifiedSample | None
    start: float
    # prompt logprobs of requests scoring their prompt, embeddings of those embedding it
    prompt: PromptScores | None = None

    def ready(self) -> bool:
        return self.sample is None or self.sample.ready()


def draws_agree(batch: ForwardBatch) -> bool:
    """Whether every tensor-parallel rank samples the same tokens on its own, so that none
    needs rank 0's: greedy rows only (the logits are all-gathered: every rank holds the same
    ones, and argmax breaks ties the same way) and no grammar mask (only the answering rank
    holds the matchers). Known on the host: the check costs no device round trip."""
    if batch.grammar_ids.shape[0]:
        return False
    greedy = (np.asarray(batch.temperature) == 0) | (np.asarray(batch.top_k) == 1)
    return bool(greedy.all())


class ModelRunner:
    """`rank` is the worker's rank among all tp_size x pp_size workers (RankLayout);
    `communicator` its stage's tensor-parallel group, `world` every worker (pipeline sends and
    start-up agreement; the TP group itself when there is one stage)."""

    def __init__(self, config: EngineConfig, rank: int, platform: Platform,
                 communicator: Communicator | None = None,
                 files: ModelFiles | None = None, world: Communicator | None = None) -> None:
        self.config, self.rank, self.platform = config, rank, platform
        self.layout = RankLayout(rank, config.tp_size, config.pp_size)
        self.communicator = communicator
        self.world = world if world is not None else (
            communicator if config.pp_size == 1 else None)
        self.device = platform.device(config.device_index(rank))
        self.dtype = serving_dtype(config, platform)
        # Seconds of each start-up phase (bus/startup.py): weights, kv_arena, graph_capture.
        self.phases: dict[str, float] = {}
        start = time.perf_counter()
        self.files = files or open_model(config.model, config.load_format, config.seed)
        mc = self.files.config
        self.model_config = mc
        self.stage = self.layout.stage_layers(mc.num_layers)
        self.max_context_len = int(config.context_length or mc.max_position_embeddings)
        if communicator is not None and config.tp_size > 1:
            # The one-shot path reads the peers' memory: one host only. A stage whose ranks
            # span nodes (tp-size above the ranks of a node) all-reduces through the library.
            spans_nodes = config.tp_size > config.ranks_per_node
            chosen = communicator.configure(
                one_shot_max_bytes=0 if spans_nodes else config.all_reduce_one_shot_max_kb * 1024,
                dtype=self.dtype)
            log.info("rank %d: tensor-parallel all-reduce: %s", rank, chosen)
        self.pipeline: PipelineLink | None = None
        if config.pp_size > 1:
            if self.world is None:
                raise ValueError("pipeline parallelism needs the world communicator")
            self.pipeline = PipelineLink(self.world, self.layout, mc.hidden_size, self.dtype,
                                         self.device)
        free_before = platform.mem_get_info()[0]
        self.quant = plan_quantization(config.quantization, self.files, platform,
                                       lm_head=config.quantize_lm_head)
        self.kv_dtype = kv_cache_dtype(config, platform, self.dtype)
        cls = model_class(mc.arch)
        self.model = cls(mc, platform, dtype=self.dtype, device=self.device,
                         max_positions=self.max_context_len, tp_rank=self.layout.tp_rank,
                         tp_size=config.tp_size, communicator=communicator,
                         ep_size=config.ep_size, quant=self.quant, stage=self.stage)
        if isinstance(self.files, DummyFiles | HFFolderFiles):
            # Random weights drawn, or safetensors read, straight onto the device.
            self.files.device = self.device
        self.model.load_weights(self.files.iter_tensors(
            self.dtype, keep_quantized=self.quant.keep_checkpoint,
            only=self.model.checkpoint_wanted))
        if self.kv_dtype != self.dtype:
            self.model.set_kv_cache_scales(self.files.kv_cache_scales())
        platform.synchronize()
        self.phases["weights"] = time.perf_counter() - start
        self.weight_bytes = self.model.weight_bytes()
        log.info("rank %d: loaded %s (%s, %s; %s) in %.1fs: %.1f MiB of weights", rank,
                 config.model, mc.arch, self.files.kind, self.quant.describe(),
                 time.perf_counter() - start, self.weight_bytes / 2**20)
        # --speculative-algorithm draft: the draft model, its KV at the target's slots
        self.draft: DraftModel | None = None
        if config.speculative_algorithm == "draft":
            from tessera.worker_proc.draft_model import DraftModel

            self.draft = DraftModel(self)
            self.weight_bytes += self.draft.weight_bytes
        tp = self.model.tp
        start = time.perf_counter()
        layers = len(self.stage.layers)
        plan = plan_kv(
            free_bytes_now=platform.mem_get_info()[0], free_bytes_before_weights=free_before,
            policy=platform.memory_policy, mem_fraction=config.mem_fraction,
            max_total_tokens=config.max_total_tokens, page_size=config.page_size,
            bytes_per_slot=KVArena.bytes_per_slot(layers, tp.num_kv_heads, mc.head_dim,
                                                  self.kv_dtype)
            + (self.draft.bytes_per_slot if self.draft is not None else 0),
            max_context_len=self.max_context_len,
            max_running_requests=config.max_running_requests)
        # One page table serves every worker: all take the slots the tightest one has.
        self.kv_plan: KVPlan = dataclasses.replace(
            plan, num_slots=self._agree_min(plan.num_slots))
        self.kv = platform.create_kv_arena(layers, self.kv_plan.num_slots,
                                           tp.num_kv_heads, mc.head_dim, self.kv_dtype)
        if self.draft is not None:
            self.draft.create_arena(self.kv_plan.num_slots)
        platform.synchronize()
        self.phases["kv_arena"] = time.perf_counter() - start
        log.info("rank %d: %s", rank, self.kv_plan.describe())
        self.graphs: DecodeGraphs | None = None
        self.mixed_graphs: MixedGraphs | None = None
        # the tokens the last step ran as: its graph's padded size, or its own count (eager)
        self.padded_tokens = 0
        start = time.perf_counter()
        try:
            with quiet_gc():
                if config.pp_size == 1:
                    self._capture_decode_graphs()
                self._capture_mixed_graphs()
                if self.draft is not None and self.graphs is not None:
                    self.draft.capture_graphs(self._decode_graphs_of, self._mixed_graphs_of)
        except Exception as exc:
            raise RuntimeError(
                f"graph capture failed on {platform.name}: {type(exc).__name__}: {exc}; "
                f"--disable-graph-capture serves without graphs, `tessera doctor --bisect-capture` "
                f"names the first op that does not capture" + coded(GRAPH_CAPTURE_FAILED)
            ) from exc
        if self.graphs is not None or self.mixed_graphs is not None:
            self.phases["graph_capture"] = time.perf_counter() - start
        self.sampler = Sampler(platform, self.device)
        # Rank 0's grammar matchers (structured output), made on the first GrammarInit.
        self.grammar: GrammarRuntime | None = None
        self._grammar_error: str | None = None
        # The token each page-table row sampled last: input ids < 0 refer to it.
        self.last_sampled = torch.zeros(config.max_running_requests, dtype=torch.int64,
                                        device=self.device)
        self.seed_default_rng()
        # Ranges of the chip's profiler around the phases of a step (--profile-ranges).
        self._phase = platform.profile_range if config.profile_ranges else _no_range

    def _capture_decode_graphs(self) -> None:
        """Capture decode graphs when the plugin can (`Capabilities.graph_capture`) and
        --disable-graph-capture is off; batches too large for them run eagerly."""
        cfg, platform = self.config, self.platform
        if cfg.disable_graph_capture or not platform.capabilities.graph_capture:
            return
        start = time.perf_counter()
        # The graphs keep the LM head's dtype: the sampler converts only the steps that need
        # float32 (Sampler.sample), and a greedy step reads them as they are.
        self.graphs = graphs = self._decode_graphs_of(
            lambda inp: self.model(inp, self.kv, float32=False))
        self.phases["graph_capture_decode"] = time.perf_counter() - start
        self.phases["graph_decode_sizes"] = float(len(graphs.sizes))
        log.info("rank %d: captured decode graphs for batch sizes %s in %.1fs", self.rank,
                 graphs.sizes, time.perf_counter() - start)

    def _agree_min(self, value: int) -> int:
        """The smallest of every worker's `value` (a collective over the world)."""
        if self.world is None or self.world.world_size == 1:
            return value
        mine = torch.tensor([value], dtype=torch.int64, device=self.device)
        return int(self.world.all_gather(mine, dim=0).min().item())

    def _capture_mixed_graphs(self) -> None:
        """Capture prefill and mixed steps of up to --graph-max-tokens tokens, where the
        decode graphs are captured (a runner and pool of their own); with several pipeline
        stages, every step (decodes too) goes through these."""
        cfg, platform = self.config, self.platform
        if cfg.pp_size == 1 and self.graphs is None:
            return  # no decode graphs: no mixed ones either
        if cfg.disable_graph_capture or not platform.capabilities.graph_capture:
            return
        if mixed_token_limit(cfg, self.kv_plan.num_slots) < 1:
            return
        start = time.perf_counter()
        stage_input = None if self.stage.is_first else (self.model_config.hidden_size,
                                                          self.dtype)
        self.mixed_graphs = graphs = self._mixed_graphs_of(
            lambda inp: self.model.hidden(inp, self.kv), self.model.logits, stage_input)
        assert graphs is not None  # the limit was checked above
        self.phases["graph_capture_mixed"] = time.perf_counter() - start
        self.phases["graph_mixed_sizes"] = float(len(graphs.buckets))
        log.info("rank %d: captured prefill/mixed graphs for %s tokens in %.1fs", self.rank,
                 graphs.buckets, time.perf_counter() - start)

    def _graph_runner(self) -> GraphRunner:
        runner = self.platform.create_graph_runner()
        if runner is None:
            raise RuntimeError(f"the {self.platform.name} plugin declares graph capture but "
                               f"create_graph_runner() returned None")
        return runner

    def _decode_graphs_of(self, forward: Callable[[ForwardInputs], torch.Tensor]
                          ) -> DecodeGraphs:
        """Decode graphs of `forward` (a decode batch's logits), captured."""
        max_bs = decode_batch_limit(self.config, self.platform.capabilities.max_capture_batch,
                                    self.kv_plan.num_pages)
        graphs = DecodeGraphs(forward, self._graph_runner(), max_bs, self.max_context_len,
                              self.device)
        graphs.capture_all()
        return graphs

    def _mixed_graphs_of(self, hidden: Any, logits: Any,
                         stage_input: tuple[int, torch.dtype] | None = None
                         ) -> MixedGraphs | None:
        """Prefill / mixed-step graphs of `hidden` (`logits` then runs eagerly), captured;
        None when no such step can be captured."""
        limit = mixed_token_limit(self.config, self.kv_plan.num_slots)
        if limit < 1:
            return None
        graphs = MixedGraphs(hidden, logits, self._graph_runner(), limit,
                             self.config.max_running_requests, self.max_context_len,
                             self.device, stage_input=stage_input)
        graphs.capture_all()
        return graphs

    def seed_default_rng(self) -> None:
        torch.manual_seed(self.config.seed)  # unseeded requests: reproducible per engine run

    @property
    def answers(self) -> bool:
        """This worker returns the sampled tokens (and holds the grammars)."""
        return self.layout.answers

    def ready_message(self) -> WorkerReady:
        return WorkerReady(
            rank=self.rank, world_size=self.config.world_size,
            num_slots=self.kv_plan.num_slots,
            page_size=self.kv_plan.page_size, max_context_len=self.max_context_len,
            vocab_size=self.model_config.vocab_size,
            eos_token_ids=list(self.model_config.eos_token_ids), device=str(self.device),
            answers=self.answers, batches_in_flight=self.config.pipeline_batches,
            overlap_steps=self.config.overlap_steps_with(
                self.platform.capabilities.overlap_steps),
            step_token_sizes=list(self.mixed_graphs.buckets) if self.mixed_graphs else [])

    # -- grammars (rank 0) --------------------------------------------------------------------

    def _grammar_runtime(self) -> GrammarRuntime | None:
        if self.grammar is None and self._grammar_error is None:
            from tessera.worker_proc.grammar.compiler import GrammarCompiler
            from tessera.worker_proc.grammar.vocab import tokenizer_info

            try:
                self.sampler.mask_op = self.platform.op("apply_token_mask")
            except Exception as exc:  # noqa: BLE001 - the plugin cannot mask: say so
                self._grammar_error = f"structured output is not available: {exc}"
                return None
            model, vocab = self.config.model, self.model_config.vocab_size
            eos = list(self.model_config.eos_token_ids)
            compiler = GrammarCompiler(lambda: tokenizer_info(model, vocab, eos))
            self.grammar = GrammarRuntime(compiler, vocab,
                                          lambda a, dtype: to_device(self.platform, a, dtype,
                                                                     self.device))
        return self.grammar

    def grammar_init(self, msg: GrammarInit) -> list[GrammarReady]:
        """Start compiling a request's grammar; replies that are ready now (errors)."""
        runtime = self._grammar_runtime()
        if runtime is None:
            return [GrammarReady(first_id=msg.first_id,
                                 error=f"{msg.grammar.param}: {self._grammar_error}")]
        runtime.init(msg)
        return runtime.ready()

    def grammar_ready(self) -> list[GrammarReady]:
        """GrammarReady for every compile finished since the last call."""
        return self.grammar.ready() if self.grammar is not None else []

    @property
    def grammars_compiling(self) -> bool:
        return self.grammar is not None and self.grammar.compiling

    # -- one step ---------------------------------------------------------------------------

    @property
    def asynchronous(self) -> bool:
        """Whether launch() returns before the device has finished."""
        return self.platform.capabilities.asynchronous

    def step(self, batch: ForwardBatch, req_to_token: np.ndarray) -> SampledTokens:
        return self.finish(self.launch(batch, req_to_token))

    def launch(self, batch: ForwardBatch, req_to_token: np.ndarray) -> PendingStep:
        """Queue one step on the device: inputs, forward, sampling, the next step's
        last-sampled tokens and the copies of the result to the host. Only `finish` waits.
        Step n+1 may be launched before step n is finished: its negative input ids read
        `last_sampled` on the device, in stream order."""
        start = time.perf_counter()
        if batch.batch_size == 0:
            return PendingStep(batch.step, None, start)
        phase = self._phase
        with phase("step"):
            with phase("inputs"):
                inputs = build_forward_inputs(batch, req_to_token, self.platform, self.device)
                if self.pipeline is None:
                    self._resolve_last_sampled(inputs)
                elif self.stage.is_first:
                    if inputs.has_last_sampled:
                        # Only the last stage knows a token in flight: the scheduler must not
                        # send a row whose previous token it has not received
                        # (batches_in_flight).
                        raise ValueError(f"step {batch.step}: an input id refers to a token "
                                         f"still in flight, which a pipeline's first stage "
                                         f"cannot know")
                else:
                    inputs.hidden_in, inputs.residual_in = self.pipeline.receive(
                        inputs.num_tokens)
                if self.stage.is_last:
                    verify = plan_verify(batch, self.platform, self.device)
                    scored = with_score_rows(batch, inputs, self.platform, self.device)
            if not self.stage.is_last:
                assert self.pipeline is not None
                with torch.inference_mode(), phase("forward"):
                    self.pipeline.send(*self.forward_hidden(inputs))
                return PendingStep(batch.step, None, start)
            if self.draft is not None:  # its KV for every token; the proposals it is asked for
                with phase("draft"):
                    self.draft.step(batch, inputs, req_to_token)
            grammar = self.grammar
            if grammar is None and self.answers and batch.grammar_ids.shape[0]:
                grammar = self._grammar_runtime()  # (its matchers are unknown: the rows fail)
            record = None
            prompt = None
            embeddings = None
            with torch.inference_mode():
                with phase("forward"):
                    if wants_pooling(batch):  # eager: the pooled hidden states stay inside graphs
                        hidden, residual = self.model.hidden(inputs, self.kv)
                        logits = self.model.logits(hidden, residual, inputs)
                        embeddings = pool_hidden(self.model, hidden, residual, batch,
                                                 self.platform, self.device)
                    else:
                        logits = self.step_logits(inputs)
                with phase("sample"):
                    if scored is not None:  # prompt positions' logits follow the sampled rows'
                        prompt = score(logits[scored.first:].float(), scored)
                        logits = logits[:scored.first]
                    mask = None
                    if grammar is not None:
                        # After the forward is queued: the device works while the matchers
                        # catch up.
                        grammar.free(batch)
                        mask, record = grammar.before_sample(batch, np.flatnonzero(batch.sample))
                        if mask is not None and verify is not None:  # a request's first row
                            mask.rows = verify.first_dev[mask.rows]
                    if verify is None:
                        sample = self.sampler.sample(logits, batch, mask)
                    else:
                        sample = self.sampler.sample(logits, batch, mask, verify.sel,
                                                     verify.offset_add)
            tokens = sample.tokens
            if self.config.tp_size > 1 and not draws_agree(batch):
                # Unseeded draws may differ between ranks: all adopt their TP rank 0's tokens.
                assert self.communicator is not None
                own = tokens if self.layout.tp_rank == 0 else torch.zeros_like(tokens)
                tokens = sample.tokens = self.communicator.all_reduce(own)
            result: DeviceSample | VerifiedSample = sample
            if verify is not None:  # every rank keeps the same proposals: the draws agree
                counts, tokens = accept(tokens, inputs.input_ids, verify)
                result = VerifiedSample(sample, counts, verify)
            with phase("copy-out"):
                if tokens.numel():
                    rows = to_device(self.platform, np.asarray(batch.rows, dtype=np.int64)[
                        np.asarray(batch.sample, dtype=bool)], torch.int64, self.device)
                    self.last_sampled[rows] = tokens
                if embeddings is not None:
                    prompt = prompt or PromptScores(torch.zeros(0, device=self.device))
                    prompt.embeddings = embeddings
                if prompt is not None:
                    # Before the sample's copies: their event covers these too.
                    prompt.start_copy(self.platform)
                result.start_copy()
            if grammar is not None:
                grammar.after_sample(record, (lambda: sample.fetch().token_ids) if verify is None
                                     else result.first_draws)  # type: ignore[union-attr]
        return PendingStep(batch.step, result, start, prompt)

    def finish(self, pending: PendingStep) -> SampledTokens:
        """Wait for a launched step and return its answer."""
        if pending.sample is None:
            return SampledTokens(step=pending.step, token_ids=np.zeros(0, np.int32))
        result = pending.sample.fetch()
        ends = self.grammar.step_ends(pending.step) if self.grammar is not None else \
            np.zeros(0, np.uint8)
        prompt: dict[str, Any] = {}
        if pending.prompt is not None:
            lps, top_ids, top_lps = pending.prompt.fetch()
            prompt = {"prompt_logprobs": lps, "prompt_top_ids": top_ids,
                      "prompt_top_logprobs": top_lps}
            if pending.prompt.embeddings is not None:
                prompt["embeddings"] = pending.prompt.fetch_embeddings()
        return SampledTokens(step=pending.step, token_ids=result.token_ids,
                             logprobs=result.logprobs, top_ids=result.top_ids,
                             top_logprobs=result.top_logprobs,
                             forward_ms=(time.perf_counter() - pending.start) * 1000.0,
                             grammar_end=ends, counts=result.counts, **prompt)

    def _resolve_last_sampled(self, inputs: ForwardInputs) -> None:
        if inputs.has_last_sampled:
            ids = inputs.input_ids
            inputs.input_ids = torch.where(ids < 0, self.last_sampled[inputs.token_rows], ids)

    def forward_hidden(self, inputs: ForwardInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A stage's output (hidden states, residual) for every token: a captured graph where
        one holds the step, else eager."""
        self.padded_tokens = inputs.num_tokens
        if self.mixed_graphs is not None and self.mixed_graphs.can_run(inputs):
            out = self.mixed_graphs.run_hidden(inputs)
            self.padded_tokens = self.mixed_graphs.last_bucket
            return out
        return self.model.hidden(inputs, self.kv)

    def forward(self, inputs: ForwardInputs) -> torch.Tensor:
        """float32 logits [S, V] (step_logits, converted where they are not)."""
        return self.step_logits(inputs).float()

    def step_logits(self, inputs: ForwardInputs) -> torch.Tensor:
        """Logits [S, V]: float32, or a decode graph's in the model's dtype (the Sampler
        takes either). A decode-only batch takes forward_decode; another step replays a graph
        captured for its padded token count when one holds it (the logits are computed after
        it for the sampled rows), else runs eagerly."""
        if inputs.is_decode:
            return self.forward_decode(inputs)
        self.padded_tokens = inputs.num_tokens
        if self.mixed_graphs is not None and self.mixed_graphs.can_run(inputs):
            logits = self.mixed_graphs.run(inputs)
            self.padded_tokens = self.mixed_graphs.last_bucket
            return logits
        return self.model(inputs, self.kv)

    def forward_decode(self, inputs: ForwardInputs) -> torch.Tensor:
        """Forward of a decode batch (every extend_len is 1): a decode graph replay when one
        was captured for its padded size (the logits are then a view of a static buffer, valid
        until the next replay), else a mixed-step graph that holds it, else eager."""
        self.padded_tokens = inputs.num_tokens
        if self.graphs is not None and self.graphs.can_run(inputs):
            logits = self.graphs.run(inputs)
            self.padded_tokens = self.graphs.last_bucket
            return logits
        if self.mixed_graphs is not None and self.mixed_graphs.can_run(inputs):
            logits = self.mixed_graphs.run(inputs)
            self.padded_tokens = self.mixed_graphs.last_bucket
            return logits
        return self.model(inputs, self.kv)
