"""`tessera bench spec`: B9, speculative decoding at batch 1, beside plain decoding, one run.

Two engines with the same flags, one after the other: plain, then with
`--speculative-algorithm ngram` (`--algorithm`). Each serves, one request at a time, greedy:

    random   B1's prompts: random token ids (512), 128 output tokens, ignore_eos. Nothing in
             them repeats, so prompt lookup should find (almost) nothing to propose.
    copy     prompts whose continuation is in the prompt:
             edit  (a model with a real tokenizer, e.g. the default model on the CPU): chat
                   requests to rewrite a paragraph with a few small edits; the answer copies
                   most of the paragraph. Outputs end at EOS (or --edit-output-len).
             self  (random weights, --load-format dummy, which copy nothing by themselves):
                   a random prompt P, then the plain engine's own greedy continuation O of
                   it, cut at the first length m where the next --output-len tokens of O
                   already occur in P + O[:m]; the prompt is P + O[:m], whose greedy
                   continuation is O[m:] again (each request records whether such an m was
                   found within --self-search-len tokens: `contains_continuation`; random
                   weights fall into loops, so one usually is).

    model (random weights, the default under --load-format dummy): the 8B random model never
             repeats itself (on the H200 not one 2-gram recurred in 2048 greedy tokens), so
             the copy part runs on a model of the same shape that repeats its last token
             (`weights_folder.write_folder(copying=True)`: output projections zero, LM head =
             embedding; every weight is still read each step), plain then speculative, on
             B1's random prompts; the random part stays on the random-weight model (the
             speculative copy engine's scheduler counters are in figures.copying_model).

With --draft-model a third engine runs `--speculative-algorithm draft` with that model on the
same prompts (figures draft_*). Under random weights its proposals share nothing with the
target's tokens: that measures what drafting costs when almost nothing is accepted.

Per request: ms per output token after the first ((last token time - first) / (tokens - 1),
B1's decode ms/step when each step gives one token), TTFT, and tokens per engine step
(completion tokens / the steps that gave them: the acceptance length). Figures (medians over
--iters requests after --warmup): copy_speedup = plain ms/token / speculative ms/token on the
copy prompts (>= 2.5 on the H200, >= 1.8 on the CPU with the default model), random_ratio =
speculative ms/token / plain ms/token on the random prompts (<= 1.05). Greedy outputs of both
engines are compared token for token (`same_tokens`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tessera.benchmarks.common import default_results_dir, new_result, write_result
from tessera.benchmarks.datasets import random_requests
from tessera.benchmarks.engine_args import (
    add_engine_args,
    resolve_engine,
    settled_scheduler_stats,
)

PARAGRAPHS = [
    "The old lighthouse stood at the edge of the cliff for more than two hundred years. Every "
    "night its keeper climbed the narrow stairs, trimmed the wick and polished the great lens, "
    "so that ships passing the rocks below could find their way safely into the harbour. When "
    "the keeper grew old, his daughter took over the work, and she kept the light burning "
    "through storms, fog and the long winter nights.",
    "Our team met on Monday morning to plan the release. We agreed that the new search page "
    "would ship first, followed by the billing changes two weeks later. Maria will write the "
    "migration guide, Tom will update the tests, and I will review every pull request before "
    "it is merged. If anything slips, we will meet again on Thursday to decide what to cut.",
    "To make the bread, mix four cups of flour with a spoon of salt and a packet of yeast. Add "
    "warm water slowly until the dough is soft but not sticky, then knead it for ten minutes. "
    "Leave it in a warm place for an hour, shape it into a loaf, and bake it in a hot oven "
    "for about forty minutes, until the crust is golden and sounds hollow when tapped.",
    "The museum opens at nine in the morning and closes at six in the evening, except on "
    "Mondays, when it is closed all day. Tickets cost twelve dollars for adults and six for "
    "children under twelve. Guided tours leave from the main hall every hour, and the cafe on "
    "the second floor serves lunch from noon until three.",
]
EDITS = [
    ("two hundred", "three hundred"), ("Monday", "Tuesday"), ("four cups", "five cups"),
    ("nine in the morning", "ten in the morning"),
]


@dataclass
class Measured:
    """One request as the caller saw it."""

    ms_per_token: float
    ttft_ms: float
    completion_tokens: int
    decode_steps: int
    tokens_per_step: float
    token_ids: list[int]


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--algorithm", default="ngram", choices=["ngram", "draft"],
                   help="the speculative engine's --speculative-algorithm")
    p.add_argument("--num-draft-tokens", type=int, default=4,
                   help="its --speculative-num-draft-tokens")
    p.add_argument("--prompt-len", type=int, default=512, help="random prompts' length")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--dataset-seed", type=int, default=0)
    p.add_argument("--copy", choices=["auto", "edit", "self", "model"], default="auto",
                   help="the copy workload: edit (chat rewrite of a paragraph; needs a real "
                        "tokenizer), self (the model's own continuation, where random weights "
                        "loop), model (a model of the target's shape that repeats its last "
                        "token, written to a temporary folder); auto: model under "
                        "--load-format dummy, else edit")
    p.add_argument("--edit-output-len", type=int, default=160,
                   help="edit workload: max_tokens (answers end at EOS before)")
    p.add_argument("--self-prompt-len", type=int, default=256,
                   help="self workload: the random prompt before the model's continuation")
    p.add_argument("--self-search-len", type=int, default=2048,
                   help="self workload: tokens of continuation searched for a repeat at most")
    p.add_argument("--self-chunk", type=int, default=256,
                   help="self workload: tokens generated between two searches")
    p.add_argument("--draft-model", default=None,
                   help="also measure --speculative-algorithm draft with this draft model (a "
                        "folder, .gguf or, under --load-format dummy, a shape config) in a third "
                        "engine: figures draft_copy_speedup, draft_random_ratio, ...")
    p.add_argument("--skip-random", action="store_true", help="measure the copy workload only")
    p.add_argument("--out-dir", default=default_results_dir())
    p.add_argument("--name", default="b9_spec")


def _measure(out: Any) -> Measured:
    times = out.token_times
    ms = (times[-1] - times[0]) / (len(times) - 1) * 1000.0 if len(times) >= 2 else float("nan")
    return Measured(ms_per_token=ms,
                    ttft_ms=out.ttft_s * 1000.0 if out.ttft_s is not None else float("nan"),
                    completion_tokens=out.completion_tokens, decode_steps=out.decode_steps,
                    tokens_per_step=out.tokens_per_step, token_ids=list(out.token_ids))


def _run(llm: Any, prompts: list[Any], params: list[Any], label: str) -> list[Measured]:
    got = []
    for i, (prompt, sp) in enumerate(zip(prompts, params, strict=True)):
        (out,) = llm.generate([prompt], sp, stream=True, use_tqdm=False)
        m = _measure(out)
        got.append(m)
        print(f"[bench] B9 {label} {i}: {m.ms_per_token:.2f} ms/token, "
              f"{m.completion_tokens} tokens in {m.decode_steps} steps "
              f"({m.tokens_per_step:.2f} per step)", file=sys.stderr)
    return got


def edit_prompts(n: int) -> list[list[dict[str, str]]]:
    out = []
    for i in range(n):
        para = PARAGRAPHS[i % len(PARAGRAPHS)]
        old, new = EDITS[i % len(EDITS)]
        out.append([{"role": "user", "content":
                     f"Rewrite the following paragraph exactly as it is, word for word, except "
                     f"that \"{old}\" becomes \"{new}\". Answer with the paragraph only.\n\n"
                     f"{para}"}])
    return out


def find_contained_cut(prompt: list[int], cont: list[int], length: int) -> int:
    """The smallest m such that cont[m:m + length] occurs in prompt + cont[:m] (-1: none)."""
    seq = np.asarray(prompt + cont, dtype=np.int32)
    base = len(prompt)
    for m in range(1, len(cont) - length + 1):
        window = seq[base + m:base + m + length].tobytes()
        hay = seq[:base + m].tobytes()
        at = hay.find(window)
        while at >= 0 and at % 4:
            at = hay.find(window, at + 1)
        if at >= 0:
            return m
    return -1


def _median(values: list[float]) -> float:
    vals = [v for v in values if v == v]
    return statistics.median(vals) if vals else float("nan")


def summarize(rows: list[Measured]) -> dict[str, Any]:
    return {"ms_per_token": _median([r.ms_per_token for r in rows]),
            "ttft_ms": _median([r.ttft_ms for r in rows]),
            "tokens_per_step": _median([r.tokens_per_step for r in rows]),
            "tokens_per_s": 1000.0 / _median([r.ms_per_token for r in rows]),
            "requests": [{k: v for k, v in asdict(r).items() if k != "token_ids"}
                         for r in rows]}


def _self_copy(llm: Any, args: argparse.Namespace, vocab_size: int, n: int
               ) -> tuple[list[list[int]], list[dict[str, Any]]]:
    """The self workload's prompts: each random prompt's greedy continuation, generated
    --self-chunk tokens at a time (the next chunk continues the prompt plus what came), until
    its next --output-len tokens repeat what came before or --self-search-len is reached."""
    from tessera.bus.messages import SamplingParams

    prompts, info = [], []
    seeds = random_requests(n, (args.self_prompt_len, args.self_prompt_len), (1, 1),
                            vocab_size, args.dataset_seed + 1)
    for req in seeds:
        cont: list[int] = []
        m = -1
        while len(cont) < args.self_search_len:
            chunk = min(args.self_chunk, args.self_search_len - len(cont))
            sp = SamplingParams(temperature=0.0, max_tokens=chunk, ignore_eos=True)
            (out,) = llm.generate([req.prompt_ids + cont], sp, use_tqdm=False)
            cont += list(out.token_ids)
            m = find_contained_cut(req.prompt_ids, cont, args.output_len)
            if m >= 0:
                break
        found = m >= 0
        if not found:
            m = len(cont) - args.output_len
        prompts.append(req.prompt_ids + cont[:m])
        info.append({"prompt_len": len(req.prompt_ids) + m, "cut": m,
                     "contains_continuation": found,
                     "expected": cont[m:m + args.output_len]})
    return prompts, info


def _copying_model_part(args: argparse.Namespace, kwargs: dict[str, Any],
                        spec_args: dict[str, Any], prompts: list[Any], greedy: Any
                        ) -> tuple[dict[str, list[Measured]], list[dict[str, Any]]]:
    """The copy workload under random weights: a model of the target's shape that repeats its
    last token (weights_folder.write_folder(copying=True)), written to a temporary folder,
    plain then speculative on B1's random prompts."""
    import shutil
    import tempfile

    from tessera.benchmarks.weights_folder import weights_bytes, write_folder
    from tessera.offline import LLM

    target = kwargs["model"]
    config = os.path.join(target, "config.json") if os.path.isdir(target) else target
    folder = tempfile.mkdtemp(prefix="tessera-b9-copying-")
    need, free = weights_bytes(config), shutil.disk_usage(folder).free
    if free < need * 1.1:
        shutil.rmtree(folder, ignore_errors=True)
        raise SystemExit(f"B9 copy workload: {need / 2**30:.1f} GiB of weights to write but "
                         f"{free / 2**30:.1f} GiB free in {folder}; pass --copy self")
    try:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        written = write_folder(config, folder, device=device, copying=True)
        print(f"[bench] B9: wrote the copying model ({written.bytes / 2**30:.1f} GiB) in "
              f"{written.seconds:.1f} s", file=sys.stderr)
        copy_kwargs = {**kwargs, "model": folder, "load_format": "auto"}
        params = [greedy] * len(prompts)
        with LLM(**copy_kwargs) as llm:
            plain = _run(llm, prompts, params, "plain copy (copying model)")
        with LLM(**copy_kwargs, **spec_args) as llm:
            spec = _run(llm, prompts, params, "speculative copy (copying model)")
            stats = {k: v for k, v in settled_scheduler_stats(llm).items()
                     if k.startswith("spec_")}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    repeats = all(len(set(m.token_ids)) == 1 for m in plain)
    return {"plain": plain, "spec": spec}, [{"weights_gb": round(written.bytes / 1e9, 2),
                                             "write_s": round(written.seconds, 1),
                                             "repeats_last_token": repeats,
                                             "scheduler_spec_stats": stats}]


def _engine_part(llm: Any, label: str, copy_prompts: list[Any] | None, copy_params: list[Any],
                 rand_prompts: list[Any], greedy: Any, skip_random: bool
                 ) -> dict[str, list[Measured]]:
    out = {} if copy_prompts is None else {
        "copy": _run(llm, copy_prompts, copy_params, f"{label} copy")}
    if not skip_random:
        out["random"] = _run(llm, rand_prompts, [greedy] * len(rand_prompts),
                             f"{label} random")
    return out


def _same(a: list[Measured], b: list[Measured]) -> bool:
    return all(x.token_ids == y.token_ids for x, y in zip(a, b, strict=True))


def _compare(plain: dict[str, Any], spec: dict[str, Any], raw_plain: dict[str, list[Measured]],
             raw_spec: dict[str, list[Measured]], prefix: str) -> dict[str, Any]:
    """A speculative engine's figures against plain: copy speedup, random ratio, tokens per
    step, and whether the greedy tokens are the same."""
    out: dict[str, Any] = {}
    if "copy" in spec:
        out.update({
            f"{prefix}copy_speedup": plain["copy"]["ms_per_token"]
            / spec["copy"]["ms_per_token"],
            f"{prefix}copy_tokens_per_step": spec["copy"]["tokens_per_step"],
            f"{prefix}copy_tokens_per_s_plain": plain["copy"]["tokens_per_s"],
            f"{prefix}copy_tokens_per_s_spec": spec["copy"]["tokens_per_s"],
            f"{prefix}same_tokens_copy": _same(raw_plain["copy"], raw_spec["copy"]),
        })
    if "random" in spec:
        out.update({
            f"{prefix}random_ratio": spec["random"]["ms_per_token"]
            / plain["random"]["ms_per_token"],
            f"{prefix}random_tokens_per_step": spec["random"]["tokens_per_step"],
            f"{prefix}same_tokens_random": _same(raw_plain["random"], raw_spec["random"]),
        })
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tessera bench spec", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(p)
    add_engine_args(p)
    args = p.parse_args(argv)
    kwargs, engine, dev_name, dtype, mconf = resolve_engine(args)
    # The plain engine runs without speculation; the other with it (speculative_* engine
    # flags, e.g. --speculative-draft-model, go to it alone).
    spec_args = {k: kwargs.pop(k) for k in list(kwargs) if k.startswith("speculative_")}
    spec_args.update(speculative_algorithm=args.algorithm,
                     speculative_num_draft_tokens=args.num_draft_tokens)
    engines = {args.algorithm: spec_args}
    if args.draft_model and args.algorithm != "draft":
        engines["draft"] = {"speculative_algorithm": "draft",
                            "speculative_num_draft_tokens": args.num_draft_tokens,
                            "speculative_draft_model": args.draft_model}
    copy_kind = args.copy if args.copy != "auto" else (
        "model" if engine.load_format == "dummy" else "edit")
    n = args.warmup + args.iters

    from tessera.bus.messages import SamplingParams
    from tessera.offline import LLM

    greedy = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    rand = random_requests(n, (args.prompt_len, args.prompt_len),
                           (args.output_len, args.output_len), mconf.vocab_size,
                           args.dataset_seed)
    rand_prompts = [r.prompt_ids for r in rand]
    copy_info: list[dict[str, Any]] = []
    raw: dict[str, dict[str, list[Measured]]] = {}
    copy_model: dict[str, list[Measured]] = {}
    copy_prompts: list[Any] | None = None
    copy_params = [greedy] * n
    if copy_kind == "model":
        copy_model, copy_info = _copying_model_part(args, kwargs, spec_args, rand_prompts,
                                                    greedy)
    with LLM(**kwargs) as llm:
        if copy_kind == "edit":
            copy_prompts = edit_prompts(n)
            copy_params = [SamplingParams(temperature=0.0, max_tokens=args.edit_output_len)] * n
        elif copy_kind == "self":
            copy_prompts, copy_info = _self_copy(llm, args, mconf.vocab_size, n)
        raw["plain"] = _engine_part(llm, "plain", copy_prompts, copy_params, rand_prompts,
                                    greedy, args.skip_random)
    spec_stats: dict[str, dict[str, float]] = {}
    failed: dict[str, str] = {}
    for name, extra in engines.items():
        try:
            with LLM(**kwargs, **extra) as llm:
                raw[name] = _engine_part(llm, name, copy_prompts, copy_params, rand_prompts,
                                         greedy, args.skip_random)
                spec_stats[name] = {k: v for k, v in settled_scheduler_stats(llm).items()
                                    if k.startswith("spec_")}
        except Exception as exc:
            if name == args.algorithm:
                raise
            # The extra draft engine must not cost the run B9's own figures.
            failed[name] = f"{type(exc).__name__}: {exc}"
            print(f"[bench] B9 {name} engine failed: {failed[name]}", file=sys.stderr)

    if copy_model:
        raw["plain"]["copy"] = copy_model["plain"]
        raw[args.algorithm]["copy"] = copy_model["spec"]
    summary = {name: {part: summarize(rows[args.warmup:]) for part, rows in parts.items()}
               for name, parts in raw.items()}
    figures: dict[str, Any] = {"copy_workload": copy_kind, "algorithm": args.algorithm}
    figures.update(_compare(summary["plain"], summary[args.algorithm], raw["plain"],
                            raw[args.algorithm], ""))
    if "draft" in raw and args.algorithm != "draft":
        figures.update(_compare(summary["plain"], summary["draft"], raw["plain"],
                                raw["draft"], "draft_"))
    if failed:
        figures["failed_engines"] = failed
    if not args.skip_random:
        figures["plain_b1_decode_ms_per_step"] = summary["plain"]["random"]["ms_per_token"]
    figures["parts"] = summary
    figures["scheduler_spec_stats"] = spec_stats
    if copy_info and copy_kind == "self":
        for info, plain in zip(copy_info, raw["plain"]["copy"], strict=True):
            expected = info.pop("expected")
            info["plain_matches_expected"] = plain.token_ids[:len(expected)] == expected
        figures["self_copy_prompts"] = copy_info
    elif copy_info:
        figures["copying_model"] = copy_info[0]
    result = new_result("B9", {**vars(args), "engine": kwargs, "speculative": engines,
                               "dtype": dtype, "device_name": dev_name})
    result["figures"] = figures
    print(f"[bench] B9: copy_speedup {figures['copy_speedup']:.2f} "
          f"({figures['copy_tokens_per_step']:.2f} tokens/step), random_ratio "
          f"{figures.get('random_ratio', float('nan')):.3f}", file=sys.stderr)
    if "draft_copy_speedup" in figures:
        print(f"[bench] B9 draft: copy_speedup {figures['draft_copy_speedup']:.2f} "
              f"({figures['draft_copy_tokens_per_step']:.2f} tokens/step), random_ratio "
              f"{figures.get('draft_random_ratio', float('nan')):.3f}", file=sys.stderr)
    path = write_result(result, args.out_dir, args.name, required=not args.skip_random)
    print(f"[bench] wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
