"""Every message that crosses the bus, in one module.

Messages are frozen dataclasses. Fields typed `np.ndarray` travel as separate zero-copy ZeroMQ
frames (see `codec.py`); every other field goes into the msgpack header and must be plain data
(None, bool, int, float, str, bytes, list, dict) or a nested dataclass registered here
(`SamplingParams`, `DetokInfo`), alone or as the values of a `dict[str, ...]`. Never pickle: a pickled message on an open socket is remote code execution.

Path of one request (ARCHITECTURE.md):
  client --GenerateRequest--> tokenizer --TokenizedRequest--> scheduler
  scheduler --ForwardBatch--> worker (every rank) --SampledTokens (rank 0)--> scheduler
  scheduler --TokenBatch / ErrorReply--> detokenizer --RequestOutputBatch / ErrorReply--> reply_to
Control: every process --Ready / Heartbeat--> supervisor; worker --WorkerReady--> scheduler.
Grammars: scheduler --GrammarInit--> worker rank 0 --GrammarReady--> scheduler.

Array conventions: token ids int32, lengths int32, per-request float parameters float32.
Arrays decoded from a frame are read-only views of the frame's memory: copy before writing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

# 2: small arrays travel in one pack frame, empty default arrays not at all (bus/codec.py).
# A peer of another version drops every message (a logged version error), never misreads one.
PROTOCOL_VERSION = 2

# --------------------------------------------------------------------------------------------
# Sampling parameters (shared by the client library, the tokenizer's validation and the worker)
# --------------------------------------------------------------------------------------------


GRAMMAR_KINDS = ("json_schema", "json_object", "regex", "grammar")


@dataclass(frozen=True)
class ParamError:
    """What is wrong with a request: the field at fault (as the request names it) and a message
    that says what to do. Checks return it so that nobody parses the field back out of text."""

    param: str
    message: str


@dataclass(frozen=True)
class GrammarSpec:
    """A constraint on the output, enforced token by token by the worker's grammar engine.

    kind: "json_schema" (spec: the schema as JSON text), "json_object" (any JSON object; spec
    unused), "regex" (spec: the pattern), "grammar" (spec: EBNF/GBNF with `root ::= ...`, or
    Lark with a `start` rule). `param` names the request field it came from, for errors.
    """

    kind: str
    spec: str = ""
    param: str = "response_format"

    MAX_SPEC_CHARS: ClassVar[int] = 1 << 20

    def validate(self) -> ParamError | None:
        param = self.param if isinstance(self.param, str) and self.param else "grammar"
        if self.kind not in GRAMMAR_KINDS:
            return ParamError(param, f"grammar kind must be one of {', '.join(GRAMMAR_KINDS)}, "
                                     f"got {self.kind!r}")
        if not isinstance(self.spec, str) or not isinstance(self.param, str):
            return ParamError(param, "a grammar's spec and param must be strings")
        if self.kind != "json_object" and not self.spec:
            return ParamError(param, f"{param}: the {self.kind} is empty")
        if len(self.spec) > self.MAX_SPEC_CHARS:
            return ParamError(param, f"{param}: the {self.kind} has {len(self.spec)} characters;"
                                     f" at most {self.MAX_SPEC_CHARS} are accepted")
        return None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GrammarSpec:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown grammar field(s): {', '.join(unknown)}")
        return cls(**data)


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters as OpenAI / vLLM / SGLang users know them.

    `max_tokens=None` means "until the context is full". `top_k <= 0` disables top-k.
    `logprobs=None`: no logprobs; `logprobs=k` (k >= 0): the sampled token's logprob and the
    top-k alternatives. `seed=None`: nondeterministic; an int makes sampling reproducible.
    `logit_bias`: (token id, bias) pairs added to the logits before sampling (OpenAI's rule:
    -100 bans a token, 100 forces it). `grammar`: the output must follow it (GrammarSpec).
    `prompt_logprobs=k`: the logprob of every prompt token given the ones before it, with the
    top-k alternatives (scoring a prompt; OpenAI's echo + logprobs). `embed`: "last" or
    "mean", the prompt's embedding (the final hidden states, normalized by the model's last
    norm, of its last token or averaged over its tokens). Only with one of them may
    `max_tokens` be 0: nothing is generated.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None
    n: int = 1
    logit_bias: tuple[tuple[int, float], ...] = ()
    grammar: GrammarSpec | None = None
    prompt_logprobs: int | None = None
    embed: str | None = None

    MAX_TOP_LOGPROBS: ClassVar[int] = 20
    MAX_N: ClassVar[int] = 16
    MAX_STOP: ClassVar[int] = 16
    MAX_LOGIT_BIAS: ClassVar[int] = 1024
    MAX_STOP_CHARS: ClassVar[int] = 1024
    MAX_TOKEN_ID: ClassVar[int] = 2**31 - 1  # ids travel as int32
    MAX_STOP_TOKEN_IDS: ClassVar[int] = 1024

    def __post_init__(self) -> None:
        if isinstance(self.logit_bias, dict):  # {token id: bias}, as OpenAI users write it
            object.__setattr__(self, "logit_bias", tuple(sorted(self.logit_bias.items())))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )

    def validate(self) -> ParamError | None:
        """The first problem (the field and what to do), or None if the values are valid.

        Checks only what can be checked without the model; the tokenizer process also checks
        lengths against the context and token ids against the vocabulary.
        """
        def bad_number(name: str, value: Any, lo: float, hi: float, *, integer: bool = False,
                       lo_open: bool = False) -> ParamError | None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                return ParamError(name, f"{name} must be a number, got {type(value).__name__}")
            if integer and not isinstance(value, int):
                return ParamError(name, f"{name} must be an integer, got {value!r}")
            if value != value or value in (float("inf"), float("-inf")):
                return ParamError(name, f"{name} must be a finite number, got {value!r}")
            if (value <= lo if lo_open else value < lo) or value > hi:
                left = "(" if lo_open else "["
                return ParamError(name, f"{name} must be in {left}{lo}, {hi}], got {value!r}")
            return None

        checks = [
            bad_number("temperature", self.temperature, 0.0, 100.0),
            bad_number("top_p", self.top_p, 0.0, 1.0, lo_open=True),
            bad_number("top_k", self.top_k, -1, 2**31 - 1, integer=True),
            bad_number("min_p", self.min_p, 0.0, 1.0),
            bad_number("repetition_penalty", self.repetition_penalty, 0.0, 100.0, lo_open=True),
            bad_number("frequency_penalty", self.frequency_penalty, -2.0, 2.0),
            bad_number("presence_penalty", self.presence_penalty, -2.0, 2.0),
            bad_number("min_tokens", self.min_tokens, 0, 2**31 - 1, integer=True),
            bad_number("n", self.n, 1, self.MAX_N, integer=True),
        ]
        if self.max_tokens is not None:
            scoring = self.prompt_logprobs is not None or self.embed is not None
            checks.append(bad_number("max_tokens", self.max_tokens, 0 if scoring else 1,
                                     2**31 - 1, integer=True))
            if isinstance(self.max_tokens, int) and isinstance(self.min_tokens, int) \
                    and self.min_tokens > self.max_tokens:
                checks.append(ParamError("min_tokens", f"min_tokens ({self.min_tokens}) must not "
                                         f"exceed max_tokens ({self.max_tokens})"))
        if self.seed is not None:
            checks.append(bad_number("seed", self.seed, -(2**63), 2**63 - 1, integer=True))
        if self.embed is not None and self.embed not in ("last", "mean"):
            checks.append(ParamError("embed", f"embed must be \"last\" or \"mean\", got "
                                              f"{self.embed!r}"))
        if self.embed is not None and self.n != 1:
            checks.append(ParamError("n", "n must be 1 for an embedding: a prompt has one"))
        if self.prompt_logprobs is not None:
            checks.append(bad_number("prompt_logprobs", self.prompt_logprobs, 0,
                                     self.MAX_TOP_LOGPROBS, integer=True))
        if self.logprobs is not None:
            checks.append(bad_number("logprobs", self.logprobs, 0, self.MAX_TOP_LOGPROBS,
                                     integer=True))
        for name in ("ignore_eos", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                checks.append(ParamError(name, f"{name} must be true or false"))
        if not isinstance(self.stop, tuple | list) or not all(
                isinstance(s, str) and s for s in self.stop):
            checks.append(ParamError("stop", "stop must be a string or a list of non-empty "
                                             "strings"))
        elif len(self.stop) > self.MAX_STOP:
            checks.append(ParamError("stop", f"stop accepts at most {self.MAX_STOP} strings, "
                                             f"got {len(self.stop)}"))
        elif any(len(s) > self.MAX_STOP_CHARS for s in self.stop):
            longest = max(len(s) for s in self.stop)
            checks.append(ParamError("stop", f"stop strings may have at most "
                                             f"{self.MAX_STOP_CHARS} characters, got one of "
                                             f"{longest}"))
        if not isinstance(self.stop_token_ids, tuple | list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= self.MAX_TOKEN_ID
                for t in self.stop_token_ids):
            checks.append(ParamError("stop_token_ids", f"stop_token_ids must be a list of token "
                                                       f"ids in [0, {self.MAX_TOKEN_ID}]"))
        elif len(self.stop_token_ids) > self.MAX_STOP_TOKEN_IDS:
            checks.append(ParamError("stop_token_ids", f"stop_token_ids accepts at most "
                                                       f"{self.MAX_STOP_TOKEN_IDS} ids, got "
                                                       f"{len(self.stop_token_ids)}"))
        bias = self._bad_logit_bias()
        checks.append(ParamError("logit_bias", bias) if bias else None)
        if self.grammar is not None:
            if not isinstance(self.grammar, GrammarSpec):
                checks.append(ParamError("grammar", "grammar must be a GrammarSpec"))
            else:
                checks.append(self.grammar.validate())
                if self.min_tokens:
                    checks.append(ParamError("min_tokens", f"min_tokens cannot be combined with "
                                                           f"{self.grammar.param}: the grammar "
                                                           f"decides where the output ends"))
        for problem in checks:
            if problem:
                return problem
        return None

    def _bad_logit_bias(self) -> str | None:
        pairs = self.logit_bias
        if not isinstance(pairs, tuple | list):
            return "logit_bias must map token ids to numbers"
        if len(pairs) > self.MAX_LOGIT_BIAS:
            return f"logit_bias has {len(pairs)} entries; at most {self.MAX_LOGIT_BIAS}"
        for pair in pairs:
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                return "logit_bias must map token ids to numbers"
            token, bias = pair
            if isinstance(token, bool) or not isinstance(token, int) or \
                    not 0 <= token <= self.MAX_TOKEN_ID:
                return f"logit_bias keys must be token ids in [0, {self.MAX_TOKEN_ID}], got " \
                       f"{token!r}"
            if isinstance(bias, bool) or not isinstance(bias, int | float) or \
                    not -100.0 <= bias <= 100.0:
                return f"logit_bias values must be numbers in [-100, 100], got {bias!r}"
        return None

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SamplingParams:
        """Build from a dict, raising ValueError naming any unknown key."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown sampling parameter(s): {', '.join(unknown)}")
        values = dict(data)
        if isinstance(values.get("grammar"), dict):
            values["grammar"] = GrammarSpec.from_dict(values["grammar"])
        bias = values.get("logit_bias")
        if isinstance(bias, list | tuple):
            values["logit_bias"] = tuple(tuple(p) if isinstance(p, list) else p for p in bias)
        elif bias is None and "logit_bias" in values:
            values["logit_bias"] = ()
        for key in ("stop", "stop_token_ids"):
            if key in values:
                v = values[key]
                if v is None:
                    values[key] = ()
                elif isinstance(v, str) and key == "stop":
                    values[key] = (v,)
                elif isinstance(v, list | tuple):
                    values[key] = tuple(v)
        return cls(**values)


@dataclass(frozen=True)
class DetokInfo:
    """What the detokenizer needs to finish one request, and where its answers go. Written by
    the tokenizer, carried unchanged by the scheduler, which reads only `reply_to` (to route
    its own errors about the request)."""

    reply_to: str
    stream: bool = True
    n: int = 1
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()  # hidden: they end a sample but are not shown
    skip_special_tokens: bool = True
    logprobs: int | None = None  # top alternatives per token (None: no logprobs)
    prompt_tokens: int = 0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DetokInfo:
        """Build from the wire, raising ValueError on an unknown key or a value of the wrong
        kind."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown DetokInfo field(s): {', '.join(unknown)}")
        if not isinstance(data.get("reply_to"), str):
            raise ValueError("DetokInfo.reply_to must be a string")
        values = dict(data)
        for key in ("stop", "stop_token_ids"):
            if key in values:
                if not isinstance(values[key], list | tuple):
                    raise ValueError(f"DetokInfo.{key} must be a list")
                values[key] = tuple(values[key])
        return cls(**values)


# --------------------------------------------------------------------------------------------
# Base
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    """Base of every bus message. `TYPE` is the wire name; `VERSION` bumps on field changes."""

    TYPE: ClassVar[str] = ""
    VERSION: ClassVar[int] = PROTOCOL_VERSION


MESSAGE_TYPES: dict[str, type[Message]] = {}
NESTED_TYPES: dict[str, type] = {"SamplingParams": SamplingParams, "GrammarSpec": GrammarSpec,
                                  "DetokInfo": DetokInfo}


def register(cls: type[Message]) -> type[Message]:
    cls.TYPE = cls.__name__
    if cls.TYPE in MESSAGE_TYPES:
        raise RuntimeError(f"message type {cls.TYPE} registered twice")
    MESSAGE_TYPES[cls.TYPE] = cls
    return cls


def _empty_i32() -> np.ndarray:
    return np.zeros(0, dtype=np.int32)


def _empty_f32() -> np.ndarray:
    return np.zeros(0, dtype=np.float32)


def _empty_i64() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


def _empty_i8() -> np.ndarray:
    return np.zeros(0, dtype=np.int8)


def _empty_u8() -> np.ndarray:
    return np.zeros(0, dtype=np.uint8)


# --------------------------------------------------------------------------------------------
# Client -> tokenizer
# --------------------------------------------------------------------------------------------


@register
@dataclass(frozen=True)
class GenerateRequest(Message):
    """A generation request. Exactly one of `prompt`, `messages`, `input_ids` is given.

    `messages` are OpenAI chat messages ({"role", "content"}, an assistant's "tool_calls", a
    tool result's "tool_call_id"); the tokenizer applies the model's chat template, with
    `tools` (OpenAI function tools) and `chat_template_kwargs` (extra template variables, such
    as Qwen 3's enable_thinking). `reply_to` is the client's own PULL endpoint.
    """

    rid: str
    reply_to: str
    sampling: SamplingParams = field(default_factory=SamplingParams)
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    input_ids: np.ndarray | None = None
    stream: bool = True
    priority: int = 0
    add_generation_prompt: bool = True
    arrival_time: float = 0.0
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # Sent again by a client whose tokenizer died before answering: the scheduler ignores it
    # if the first copy got through.
    resent: bool = False


@register
@dataclass(frozen=True)
class AbortRequest(Message):
    """Abort a request (client gone, timeout, explicit). Sent to the tokenizer, forwarded on.
    `index`: only that sample of an n > 1 request (the detokenizer ends a choice that matched
    a stop string while the others go on); None: every sample.

    reason LOST_ROUTE (from a restarted detokenizer that never saw the request start): the
    scheduler fails it with an error to its reply_to instead of a plain "abort" finish.
    """

    rid: str
    reason: str = "abort"
    index: int | None = None

    LOST_ROUTE: ClassVar[str] = "lost_route"


# --------------------------------------------------------------------------------------------
# Tokenizer -> scheduler
# --------------------------------------------------------------------------------------------


@register
@dataclass(frozen=True)
class TokenizedRequest(Message):
    """A validated, tokenized request.

    `detok` is what the detokenizer needs to finish the request; the scheduler passes it on,
    unchanged, the first time the request appears in a TokenBatch, and reads only its
    `reply_to`.
    """

    rid: str
    input_ids: np.ndarray
    sampling: SamplingParams
    detok: DetokInfo
    priority: int = 0
    arrival_time: float = 0.0
    resent: bool = False  # see GenerateRequest.resent


# --------------------------------------------------------------------------------------------
# Scheduler <-> worker
# --------------------------------------------------------------------------------------------


@register
@dataclass(frozen=True)
class WorkerReady(Message):
    """A worker rank has loaded its model and carved its KV arena."""

    rank: int
    world_size: int
    num_slots: int  # KV token slots in the arena (num_pages * page_size)
    page_size: int
    max_context_len: int
    vocab_size: int
    eos_token_ids: list[int] = field(default_factory=list)
    device: str = ""
    # This rank returns SampledTokens and takes GrammarInit (exactly one rank does).
    answers: bool = False
    # 0: one pipeline, the scheduler may send step n+1 before step n's tokens are back and
    # refer to them (input id -1). N > 0: the workers hold N batches in flight at once
    # (pipeline stages), and a batch may not refer to a token of a batch still in flight.
    batches_in_flight: int = 0
    # --overlap-steps as the workers resolved it against their plugin (auto: its
    # Capabilities.overlap_steps); 0 from a sender that did not say (the scheduler then
    # takes 2 for auto).
    overlap_steps: int = 0
    # The token counts this rank runs a step that prefills at (its captured graphs: a step of
    # T tokens runs as the smallest size >= T, padded; beyond the largest, as its own count).
    # Empty: every step runs at its own count.
    step_token_sizes: list[int] = field(default_factory=list)


@register
@dataclass(frozen=True)
class ForwardBatch(Message):
    """One model step for a batch of B requests, sent to every rank.

    Before sending, the scheduler has written each request's KV slot indices into its row of
    the shared-memory page table `req_to_token[rows[i], 0:seq_lens[i]]`; the slots of this
    step's new tokens are `req_to_token[rows[i], seq_lens[i]-extend_lens[i]:seq_lens[i]]`.

    Per request i (arrays of length B unless said otherwise):
      rows          int32  row in req_to_token
      seq_lens      int32  tokens in KV after this step (cached prefix + earlier chunks + new)
      extend_lens   int32  new tokens this step (1 for a decode; a prefill chunk's length)
      input_ids     int32  [sum(extend_lens)] the new tokens, request by request. A negative id
                           means "the token this rank sampled last for this row" (lets the
                           scheduler send step n+1 before it has read step n's result).
      sample        uint8  1 if the request samples a token after this step (0 for a prefill
                           chunk that is not the last)
      output_lens   int32  tokens generated so far (seed offset; min_tokens)
      temperature, top_p, min_p, repetition_penalty, frequency_penalty, presence_penalty  float32
      top_k         int32  (<= 0: off)
      seeds         int64  (-1: unseeded)
      logprobs      int32  top-N logprobs wanted (-1: none; 0: only the sampled token's)
      block_offsets int32  [B+1] CSR offsets into block_ids: token ids forbidden this step
      block_ids     int32  (EOS / stop ids while output_len < min_tokens)
      hist_offsets  int32  [B+1] CSR offsets into hist_ids (empty arrays if no request has
      hist_ids      int32  penalties): prompt then output tokens of requests with penalties
      hist_prompt_lens int32 [B] how many of a request's hist_ids are prompt tokens
      bias_offsets  int32  [B+1] CSR offsets into bias_ids / bias_values (empty arrays if no
      bias_ids      int32  request has a logit_bias): token ids and the bias added to their
      bias_values   float32 logits
      grammar_ids   int64  [B] the grammar matcher of each request (-1: none; empty if no
                           request of the batch has a grammar). Rank 0 holds the matchers
                           (GrammarInit) and masks the logits of these rows.
      grammar_free  int64  matchers whose sequences ended: rank 0 may drop them
      prompt_targets int32 [sum(extend_lens)] aligned with input_ids: for requests that score
                           their prompt (prompt_logprobs), the token that follows each
                           position, whose logprob rank 0 returns; -1 elsewhere (empty when no
      prompt_top_n  int32  [B] request scores its prompt): top alternatives wanted (-1: none)
      draft_lens    int32  [B] speculative decoding (empty when no request of the step has
                           proposals): the last draft_lens[i] of request i's extend_lens[i]
                           tokens are proposed continuations, verified in this step. Such a
                           request samples a token after each of its last draft_lens[i] + 1
                           tokens and keeps the longest run of proposals equal to its samples
                           plus the sample after that run (SampledTokens.counts). With
                           --speculative-algorithm draft the proposals are the worker's
                           draft model's: their input ids are placeholders it overwrites.
      embed         int8   [B] pooled final hidden states wanted from the request's chunk:
                           0 none, EMBED_LAST (its last token's), EMBED_MEAN (the sum over
                           its tokens); empty when no request embeds
    """

    EMBED_LAST: ClassVar[int] = 1
    EMBED_MEAN: ClassVar[int] = 2

    step: int
    rows: np.ndarray
    seq_lens: np.ndarray
    extend_lens: np.ndarray
    input_ids: np.ndarray
    sample: np.ndarray
    output_lens: np.ndarray
    temperature: np.ndarray
    top_p: np.ndarray
    top_k: np.ndarray
    min_p: np.ndarray
    repetition_penalty: np.ndarray
    frequency_penalty: np.ndarray
    presence_penalty: np.ndarray
    seeds: np.ndarray
    logprobs: np.ndarray
    block_offsets: np.ndarray = field(default_factory=_empty_i32)
    block_ids: np.ndarray = field(default_factory=_empty_i32)
    hist_offsets: np.ndarray = field(default_factory=_empty_i32)
    hist_ids: np.ndarray = field(default_factory=_empty_i32)
    hist_prompt_lens: np.ndarray = field(default_factory=_empty_i32)
    bias_offsets: np.ndarray = field(default_factory=_empty_i32)
    bias_ids: np.ndarray = field(default_factory=_empty_i32)
    bias_values: np.ndarray = field(default_factory=_empty_f32)
    grammar_ids: np.ndarray = field(default_factory=_empty_i64)
    grammar_free: np.ndarray = field(default_factory=_empty_i64)
    prompt_targets: np.ndarray = field(default_factory=_empty_i32)
    prompt_top_n: np.ndarray = field(default_factory=_empty_i32)
    draft_lens: np.ndarray = field(default_factory=_empty_i32)
    embed: np.ndarray = field(default_factory=_empty_i8)
    is_decode: bool = False  # every request has extend_len 1 (graph replay may be used)

    @property
    def batch_size(self) -> int:
        return int(self.rows.shape[0])


@register
@dataclass(frozen=True)
class SampledTokens(Message):
    """Rank 0's answer to a ForwardBatch: one token per request with sample == 1, in order.

    logprobs float32 [S]: log-probability of each sampled token (empty if none asked).
    top_ids int32 / top_logprobs float32 [S, N]: top-N alternatives, N = max asked (padded
    with -1 / -inf for requests that asked fewer).
    grammar_end uint8 [S] (empty when no request of the step has a grammar): GRAMMAR_DONE when
    the token completed the request's grammar (it was a stop token the grammar allowed),
    GRAMMAR_FAILED when the grammar engine could not follow the request (it is failed).
    prompt_logprobs float32 [P], prompt_top_ids int32 / prompt_top_logprobs float32 [P, N]:
    for each position of the batch whose ForwardBatch.prompt_targets is >= 0, in order, the
    logprob of that target and the top-N alternatives (empty when none was asked).
    counts int32 [S] (empty when the step verified no proposals: one token each): tokens of
    each sampling request, token_ids holding them request by request (a request that verified
    proposals gets its accepted ones and the token sampled after them); logprobs / top_* then
    have one row per token.
    embeddings float32 [E, hidden]: one row per request of the batch with embed > 0, in
    order (its chunk's last token's normed hidden state, or the sum over the chunk's tokens).
    """

    GRAMMAR_DONE: ClassVar[int] = 1
    GRAMMAR_FAILED: ClassVar[int] = 2

    step: int
    token_ids: np.ndarray
    logprobs: np.ndarray = field(default_factory=_empty_f32)
    top_ids: np.ndarray = field(default_factory=_empty_i32)
    top_logprobs: np.ndarray = field(default_factory=_empty_f32)
    # the step's own time on the worker: launch (or the previous step's end, when queued
    # behind it) to result
    forward_ms: float = 0.0
    error: str | None = None  # the step failed: the scheduler aborts its requests
    grammar_end: np.ndarray = field(default_factory=_empty_u8)
    prompt_logprobs: np.ndarray = field(default_factory=_empty_f32)
    prompt_top_ids: np.ndarray = field(default_factory=_empty_i32)
    prompt_top_logprobs: np.ndarray = field(default_factory=_empty_f32)
    counts: np.ndarray = field(default_factory=_empty_i32)
    embeddings: np.ndarray = field(default_factory=_empty_f32)


@register
@dataclass(frozen=True)
class GrammarInit(Message):
    """Scheduler -> worker rank 0: compile `grammar` (off the step path) and make `count`
    matchers for it, ids `first_id` .. `first_id + count - 1` (one per sample of a request).
    Answered with GrammarReady; the request is scheduled only after it."""

    first_id: int
    count: int
    grammar: GrammarSpec


@register
@dataclass(frozen=True)
class GrammarReady(Message):
    """Worker rank 0 -> scheduler: the matchers of GrammarInit(first_id) exist, or `error`
    says why the grammar cannot be used (the request then fails with 400)."""

    first_id: int
    error: str | None = None


@register
@dataclass(frozen=True)
class FlushCache(Message):
    """Drop every unreferenced prefix from the radix cache (scheduler)."""

    reason: str = ""


# --------------------------------------------------------------------------------------------
# Scheduler -> detokenizer -> client
# --------------------------------------------------------------------------------------------


@register
@dataclass(frozen=True)
class TokenBatch(Message):
    """New tokens for R (request, sample-index) pairs after one step.

    rids[r], indices[r]: request id and sample index (0..n-1). counts[r] tokens of token_ids
    (concatenated) belong to r. finish[r] is None while running, else "stop", "length" or
    "abort". new_requests maps rid -> the TokenizedRequest's DetokInfo, sent once, the first
    time a rid appears. logprobs / top_ids / top_logprobs follow SampledTokens' layout, one row
    per token in token_ids, when any request asked for them.
    Prompt scoring (prompt_logprobs): prompt_counts[q] entries of the prompt_* arrays belong to
    request prompt_rids[q]: each a prompt token, its logprob given the tokens before it (NaN
    for the first token of the prompt) and the top alternatives. embedding_rids[e]: the
    request whose (unnormalized) embedding is row e of `embeddings`.
    """

    rids: list[str]
    indices: list[int]
    counts: np.ndarray
    token_ids: np.ndarray
    finish: list[str | None]
    prompt_tokens: list[int]
    cached_tokens: list[int]
    new_requests: dict[str, DetokInfo] = field(default_factory=dict)
    matched_stop: list[int | None] = field(default_factory=list)
    logprobs: np.ndarray = field(default_factory=_empty_f32)
    top_ids: np.ndarray = field(default_factory=_empty_i32)
    top_logprobs: np.ndarray = field(default_factory=_empty_f32)
    prompt_rids: list[str] = field(default_factory=list)
    prompt_counts: np.ndarray = field(default_factory=_empty_i32)
    prompt_token_ids: np.ndarray = field(default_factory=_empty_i32)
    prompt_logprobs: np.ndarray = field(default_factory=_empty_f32)
    prompt_top_ids: np.ndarray = field(default_factory=_empty_i32)
    prompt_top_logprobs: np.ndarray = field(default_factory=_empty_f32)
    embedding_rids: list[str] = field(default_factory=list)
    embeddings: np.ndarray = field(default_factory=_empty_f32)


@register
@dataclass(frozen=True)
class ResetRequests(Message):
    """Scheduler -> detokenizer when a scheduler starts: requests the detokenizer still tracks
    belonged to a scheduler that is gone (a restart) and will get no more output; each is
    answered with an error and forgotten."""

    reason: str = ""


@register
@dataclass(frozen=True)
class RequestOutput(Message):
    """Detokenizer -> client: text (and tokens) produced since the last RequestOutput for
    (rid, index). `finish_reason` set on the last one, with the usage counts. A request that
    scores its prompt gets, once (index 0), every prompt token with its logprob (NaN for the
    first), its text and its top alternatives in the prompt_* fields."""

    rid: str
    index: int
    text: str
    token_ids: np.ndarray
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    # engine steps that gave this choice tokens so far (completion_tokens / decode_steps is
    # its mean acceptance length under speculative decoding; 1 without)
    decode_steps: int = 0
    logprobs: np.ndarray = field(default_factory=_empty_f32)
    top_ids: np.ndarray = field(default_factory=_empty_i32)
    top_logprobs: np.ndarray = field(default_factory=_empty_f32)
    token_texts: list[str] = field(default_factory=list)  # per token, when logprobs asked
    # per token, the text of each of top_ids' alternatives (OpenAI's top_logprobs show text)
    top_token_texts: list[list[str]] = field(default_factory=list)
    prompt_token_ids: np.ndarray = field(default_factory=_empty_i32)
    prompt_logprobs: np.ndarray = field(default_factory=_empty_f32)
    prompt_top_ids: np.ndarray = field(default_factory=_empty_i32)
    prompt_top_logprobs: np.ndarray = field(default_factory=_empty_f32)
    prompt_token_texts: list[str] = field(default_factory=list)
    prompt_top_token_texts: list[list[str]] = field(default_factory=list)
    embedding: np.ndarray = field(default_factory=_empty_f32)  # float32 [hidden], with sample 0


@register
@dataclass(frozen=True)
class RequestOutputBatch(Message):
    """Detokenizer -> one client: every RequestOutput of one step bound for the same reply_to,
    as columns, so that a step costs one message per client instead of one per request
    (`bus/output_batch.py` packs and unpacks them).

    Row r is RequestOutput(rids[r], indices[r], texts[r],
    token_ids[token_offsets[r]:token_offsets[r + 1]], finish_reasons[r], prompt_tokens[r],
    completion_tokens[r], cached_tokens[r]) plus, when logprob_offsets is not empty, the
    logprob rows logprob_offsets[r]:logprob_offsets[r + 1] of logprobs / top_ids /
    top_logprobs (the first top_widths[r] columns; the batch is padded to its widest row with
    id -1 / -inf) and token_texts[r] / top_token_texts[r].
    """

    rids: list[str]
    indices: list[int]
    texts: list[str]
    token_offsets: np.ndarray  # int32 [R + 1]
    token_ids: np.ndarray  # int32
    finish_reasons: list[str | None]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    cached_tokens: list[int]
    decode_steps: list[int] = field(default_factory=list)  # empty: unknown (0)
    logprob_offsets: np.ndarray = field(default_factory=_empty_i32)  # int32 [R + 1] or []
    logprobs: np.ndarray = field(default_factory=_empty_f32)
    top_widths: list[int] = field(default_factory=list)
    top_ids: np.ndarray = field(default_factory=_empty_i32)  # int32 [L, K]
    top_logprobs: np.ndarray = field(default_factory=_empty_f32)  # float32 [L, K]
    token_texts: list[list[str]] = field(default_factory=list)
    top_token_texts: list[list[list[str]]] = field(default_factory=list)


@register
@dataclass(frozen=True)
class ErrorReply(Message):
    """A request failed. `status` follows HTTP (400 bad input, 413 too long, 429, 503...).

    `reply_to` is set when the sender is not the detokenizer (which knows the route itself).
    """

    rid: str
    status: int
    message: str
    error_type: str = "invalid_request_error"
    param: str | None = None
    reply_to: str | None = None


# --------------------------------------------------------------------------------------------
# Control plane
# --------------------------------------------------------------------------------------------


@register
@dataclass(frozen=True)
class Ready(Message):
    """A process finished start-up. `info` carries what the supervisor reports."""

    process: str
    pid: int
    info: dict[str, Any] = field(default_factory=dict)


@register
@dataclass(frozen=True)
class Heartbeat(Message):
    """Liveness and metrics of one process, sent every `heartbeat_interval_s`."""

    process: str
    pid: int
    time: float
    stats: dict[str, float] = field(default_factory=dict)


@register
@dataclass(frozen=True)
class StatusRequest(Message):
    """Ask the supervisor for the latest heartbeat of every process (health, metrics)."""

    reply_to: str
    nonce: int = 0


@register
@dataclass(frozen=True)
class StatusReply(Message):
    """processes: name -> {"alive": bool, "pid": int, "age_s": float, "ready": bool,
    "stats": {...} (last heartbeat), "info": {...} (its Ready info)}; `startup` the start-up
    report once every process was ready (bus/startup.py: ready_s, phases, stages, detail)."""

    nonce: int
    processes: dict[str, dict[str, Any]]
    ready: bool
    startup: dict[str, Any] = field(default_factory=dict)


@register
@dataclass(frozen=True)
class Shutdown(Message):
    """Ask a process to stop (drain where it can)."""

    reason: str = ""


# --------------------------------------------------------------------------------------------
# Between the nodes of a multi-host engine (bus/node_link.py), over the encrypted tcp link
# --------------------------------------------------------------------------------------------


@register
@dataclass(frozen=True)
class NodeJoin(Message):
    """Node `node_rank`'s link asks node 0's to take it in. `config_digest`: a hash of the
    engine configuration every node must share (model, sizes, batching)."""

    node_rank: int
    nnodes: int
    ranks: list[int]
    config_digest: str


@register
@dataclass(frozen=True)
class NodeWelcome(Message):
    """Node 0's answer to a NodeJoin: accepted, or why not."""

    node_rank: int
    accepted: bool
    reason: str = ""


@register
@dataclass(frozen=True)
class NodeHeartbeat(Message):
    """Liveness of a node's link, both ways, every heartbeat interval. `leaving`: the node
    stops on purpose (its peers stop too, cleanly)."""

    node_rank: int
    time: float
    leaving: bool = False


@register
@dataclass(frozen=True)
class PageRows(Message):
    """Page-table entries for another node's copy of `req_to_token`, sent before the step that
    reads them: row rows[i] gets slots[offsets[i]:offsets[i+1]] from column starts[i] on."""

    step: int
    rows: np.ndarray
    starts: np.ndarray
    offsets: np.ndarray
    slots: np.ndarray
