"""B8: the price of structured output. B3's c=32 tier against one server, in one run, plain
and with the same requests each carrying a JSON schema (`response_format`), twice each in
the order plain, grammar, grammar, plain after a warm-up at the same concurrency.

    fraction_of_plain = output tok/s with the schema / output tok/s without   (target >= 0.9)

Requests keep B3's lengths and ignore_eos, so a constrained request runs to its max_tokens
unless its JSON is complete first (then the grammar ends it). With random weights the model
is mostly writing one long string value, as a real model filling a `body` field would. A
dummy shape config is served with a byte-level vocabulary (benchmarks/dummy_model.py) so the
grammar engine has tokens that spell JSON. The schema compiles (and the grammar engine reads
the vocabulary) during warm-up, not in the measured tiers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from tessera.benchmarks.datasets import fresh_prompts, parse_range, random_requests
from tessera.benchmarks.http_client import RequestMetrics
from tessera.benchmarks.serving_driver import run_tier, tier_stats

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "title": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "author": {"type": "object",
                   "properties": {"name": {"type": "string"}, "email": {"type": "string"}},
                   "required": ["name", "email"]},
        "status": {"enum": ["draft", "published", "archived"]},
        "body": {"type": "string"},
    },
    "required": ["id", "title", "tags", "author", "status", "body"],
}
RESPONSE_FORMAT = {"response_format": {"type": "json_schema", "json_schema": {
    "name": "document", "schema": SCHEMA, "strict": True}}}


def json_outcomes(metrics: list[RequestMetrics]) -> dict[str, int | None]:
    """How the constrained requests ended: complete JSON (`parsed_json`: it parses and holds
    every required field; `valid_json`: it validates against the schema, None without the
    jsonschema package, which the GPU machine lacks), or cut by length."""
    try:
        import jsonschema
    except ImportError:  # a GPU machine may lack it: the other counts still come
        jsonschema = None

    out: dict[str, int | None] = {"finished_by_grammar": 0, "parsed_json": 0, "valid_json": 0,
                                  "cut_by_max_tokens": 0}
    for m in metrics:
        if not m.ok:
            continue
        if m.finish_reason == "length":
            out["cut_by_max_tokens"] = (out["cut_by_max_tokens"] or 0) + 1
            continue
        out["finished_by_grammar"] = (out["finished_by_grammar"] or 0) + 1
        try:
            doc = json.loads(m.text)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and all(k in doc for k in SCHEMA["required"]):
            out["parsed_json"] = (out["parsed_json"] or 0) + 1
        if jsonschema is None:
            out["valid_json"] = None
            continue
        try:
            jsonschema.validate(doc, SCHEMA)
            out["valid_json"] = (out["valid_json"] or 0) + 1
        except jsonschema.ValidationError:
            pass
    return out


def run_b8(args: argparse.Namespace, url: str, vocab: int) -> dict[str, Any]:
    c = int(str(args.concurrency).split(",")[0])
    n = max(args.min_requests, args.requests_per_concurrency * c)
    reqs = random_requests(n, parse_range(args.prompt_len), parse_range(args.output_len),
                           vocab, seed=args.seed + c)
    warm = random_requests(max(2, args.warmup), (16, 32), (4, 8), vocab, seed=args.seed + 999)
    # Warm-up at the measured tier's concurrency and lengths too (its own prompts): the first
    # tier of an H200 run at 9806725 had a TTFT p90 of 520 ms against 51 ms for the second,
    # which made the schema look 17% faster than plain, and a warm-up with 8-16 token
    # outputs at a7126dd did not remove it (plain 3788 then 4546 tok/s): what warms is in
    # the long decodes.
    warm_tier = random_requests(c, parse_range(args.prompt_len), parse_range(args.output_len),
                                vocab, seed=args.seed + 998)
    for extra in (None, RESPONSE_FORMAT):
        asyncio.run(run_tier(url, warm, concurrency=len(warm), api_key=args.api_key,
                             extra_body=extra, timeout_s=1800.0))
        asyncio.run(run_tier(url, warm_tier, concurrency=c, api_key=args.api_key,
                             extra_body=extra, timeout_s=1800.0))
    # Two rounds in the order plain, grammar, grammar, plain: a drift over the run (clocks)
    # weighs on both sides alike. Each side's figures pool its two rounds. Every round has
    # the same lengths and prompts of its own: with one set of prompts the prefix cache held
    # every prompt from the first round on, and the first plain round alone paid its prefill
    # (an H200 run at cffd704: plain 3758 then 4472 tok/s, the schema rounds 4440 and 4443).
    runs: dict[str, list[tuple[list[RequestMetrics], float]]] = {"plain": [], "grammar": []}
    for i, name in enumerate(("plain", "grammar", "grammar", "plain")):
        extra = RESPONSE_FORMAT if name == "grammar" else None
        round_reqs = fresh_prompts(reqs, vocab, seed=args.seed + 1000 + i)
        runs[name].append(asyncio.run(run_tier(url, round_reqs, concurrency=c,
                                               api_key=args.api_key, seed=args.seed,
                                               extra_body=extra)))
        t = tier_stats(*runs[name][-1], concurrency=c)
        print(f"[bench] B8 {name} round {len(runs[name])}: {t['output_tok_per_s']:.1f} out "
              f"tok/s, ITL p50 {t['itl_p50_ms']:.2f} ms p99 {t['itl_p99_ms']:.2f} ms, "
              f"errors {t['errors']}", file=sys.stderr)
    tiers: dict[str, dict[str, Any]] = {}
    for name, rounds in runs.items():
        tiers[name] = tier_stats([m for metrics, _ in rounds for m in metrics],
                                 sum(wall for _, wall in rounds), concurrency=c)
        tiers[name]["rounds_output_tok_per_s"] = [
            tier_stats(*r, concurrency=c)["output_tok_per_s"] for r in rounds]
    outcomes = json_outcomes([m for metrics, _ in runs["grammar"] for m in metrics])
    plain, grammar = tiers["plain"]["output_tok_per_s"], tiers["grammar"]["output_tok_per_s"]
    fraction = grammar / plain if plain else float("nan")
    print(f"[bench] B8: fraction_of_plain {fraction:.3f} ({outcomes})", file=sys.stderr)
    return {"fraction_of_plain": fraction, "plain": tiers["plain"],
            "grammar": tiers["grammar"], "grammar_outcomes": outcomes, "schema": SCHEMA,
            "errors": tiers["plain"]["errors"] + tiers["grammar"]["errors"]}
