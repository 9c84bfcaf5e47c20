"""Drive a GrammarRuntime the way the pipelined worker does, on any device: random logits
(any token is likely), the plugin's sampler and apply_token_mask, step n+1's mask built
before step n's answer is taken, tokens the scheduler dropped rolled back."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import numpy as np
import torch

from tessera.bus.messages import ForwardBatch, GrammarInit, GrammarSpec, SampledTokens
from tessera.hal.platform import Platform
from tessera.worker_proc.grammar.compiler import GrammarCompiler
from tessera.worker_proc.grammar.runtime import GrammarRuntime
from tessera.worker_proc.sampler import Sampler

REGEX = r"(yes|no), [0-9]{2}"
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "kind": {"enum": ["cat", "dog"]},
    "tags": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
             "maxItems": 3}},
    "required": ["name", "kind", "tags"]}


def parse_json(text: str) -> Any:
    """The JSON a schema-constrained request produced. xgrammar's rule for a string with
    maxLength admits any character but quote, backslash, CR and LF, so raw control characters
    (U+0000-U+001F) may appear inside strings: valid for the grammar, refused by a strict
    parser (docs/applications.md says so to users)."""
    return json.loads(text, strict=False)


def follows_schema(obj: Any) -> bool:
    """SCHEMA checked by hand (the GPU machine may lack the jsonschema package)."""
    return (isinstance(obj, dict) and set(obj) == {"name", "kind", "tags"}
            and isinstance(obj["name"], str) and len(obj["name"]) <= 8
            and obj["kind"] in ("cat", "dog") and isinstance(obj["tags"], list)
            and len(obj["tags"]) <= 3
            and all(isinstance(t, int) and 0 <= t <= 99 for t in obj["tags"]))


def make_batch(n: int, **arrays: Any) -> ForwardBatch:
    base: dict[str, Any] = dict(
        temperature=np.ones(n, np.float32), top_p=np.ones(n, np.float32),
        top_k=np.full(n, -1, np.int32), min_p=np.zeros(n, np.float32),
        repetition_penalty=np.ones(n, np.float32), frequency_penalty=np.zeros(n, np.float32),
        presence_penalty=np.zeros(n, np.float32), seeds=np.full(n, -1, np.int64),
        logprobs=np.full(n, -1, np.int32), output_lens=np.zeros(n, np.int32))
    for key, value in arrays.items():
        base[key] = np.asarray(value, dtype=base[key].dtype if key in base else None)
    return ForwardBatch(step=0, rows=np.arange(n, dtype=np.int32),
                        seq_lens=np.ones(n, np.int32), extend_lens=np.ones(n, np.int32),
                        input_ids=np.zeros(n, np.int32), sample=np.ones(n, np.uint8), **base)


def ready_runtime(info: Any, vocab: int, platform: Platform, device: torch.device
                  ) -> GrammarRuntime:
    """A runtime with matchers 0, 1 (REGEX) and 2 (SCHEMA) compiled and made."""
    from tessera.worker_proc.forward_inputs import to_device

    rt = GrammarRuntime(GrammarCompiler(lambda: info), vocab,
                        lambda a, dtype: to_device(platform, a, dtype, device))
    rt.init(GrammarInit(first_id=0, count=2, grammar=GrammarSpec("regex", REGEX, "regex")))
    rt.init(GrammarInit(first_id=2, count=1, grammar=GrammarSpec(
        "json_schema", json.dumps(SCHEMA), "response_format")))
    replies: list[Any] = []
    deadline = time.monotonic() + 120
    while len(replies) < 2 and time.monotonic() < deadline:
        replies += rt.ready()
        time.sleep(0.01)
    assert sorted((r.first_id, r.error) for r in replies) == [(0, None), (2, None)]
    return rt


def run(rt: GrammarRuntime, sampler: Sampler, gids: list[int], vocab: int, *, seed: int,
        device: torch.device, drop_at: int | None = None,
        max_steps: int = 200) -> tuple[dict[int, list[int]], dict[int, int]]:
    """Decode every constrained row (gid >= 0) to its grammar's end; rows without a grammar
    (-1) ride along. Returns each row's tokens and the step at which each row ended."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out: dict[int, list[int]] = {i: [] for i in range(len(gids))}
    ended: dict[int, int] = {}
    launched: list[tuple[int, list[int], Any]] = []  # (step, rows, sample) not answered yet
    dropped: set[int] = set()
    for step in range(max_steps):
        rows = [i for i in range(len(gids)) if i not in ended]
        if all(gids[i] < 0 for i in rows):
            break  # every constrained row ended
        if step == drop_at:
            dropped.add(rows[0])  # the scheduler will drop the token in flight for this row
        # As the scheduler counts them: the tokens received plus the one still in flight.
        in_flight = {i for _, launched_rows, _ in launched for i in launched_rows} - dropped
        batch = dataclasses.replace(make_batch(
            len(rows), seeds=[seed * 1000 + step] * len(rows),
            output_lens=[len(out[i]) + (i in in_flight) for i in rows]),
            step=step, grammar_ids=np.array([gids[i] for i in rows], np.int64))
        logits = torch.randn(len(rows), vocab, generator=gen, device=device) * 3
        mask, record = rt.before_sample(batch, np.arange(len(rows)))
        sample = sampler.sample(logits, batch, mask)
        sample.start_copy()
        rt.after_sample(record, lambda s=sample: s.fetch().token_ids)
        launched.append((step, rows, sample))
        if len(launched) == 2:  # answer step n after launching step n+1
            _answer(rt, *launched.pop(0), out, ended, dropped)
    while launched:
        _answer(rt, *launched.pop(0), out, ended, dropped)
    return out, ended


def _answer(rt: GrammarRuntime, step: int, rows: list[int], sample: Any,
            out: dict[int, list[int]], ended: dict[int, int], dropped: set[int]) -> None:
    tokens = sample.fetch().token_ids
    ends = rt.step_ends(step)
    for pos, i in enumerate(rows):
        if i in ended:
            continue  # finished in the previous step: the scheduler drops this token
        if i in dropped:
            dropped.discard(i)
            continue
        out[i].append(int(tokens[pos]))
        assert not ends.shape[0] or ends[pos] != SampledTokens.GRAMMAR_FAILED
        if ends.shape[0] and ends[pos] == SampledTokens.GRAMMAR_DONE:
            ended[i] = step
