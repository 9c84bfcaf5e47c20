"""`tessera bench spec` (B9) end to end on a tiny random shape on the cpu plugin: plain, ngram
and a 1-layer draft model in one run; the copy part on a model of the shape that repeats its
last token (and, in --copy self, on prompts built from the model's own greedy loops); every
engine's greedy tokens are the same; the B9 JSON holds the figures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tessera.benchmarks.common import missing_figures
from tessera.benchmarks.speculative import edit_prompts, find_contained_cut

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "vocab_size": 512, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "max_position_embeddings": 2048, "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2}


def test_contained_cut_is_the_first_whose_continuation_came_before() -> None:
    prompt = [9, 8, 7]
    cont = [1, 2, 3, 1, 2, 3, 1, 2]
    # cont[3:5] == [1, 2] occurs in prompt + cont[:3]; nothing earlier does
    assert find_contained_cut(prompt, cont, 2) == 3
    # the window must lie wholly in what came before it
    assert find_contained_cut(prompt, cont, 5) == -1
    assert find_contained_cut(prompt, [1, 2, 3] * 4, 5) == 6
    assert find_contained_cut(prompt, [1, 2, 3, 4], 2) == -1
    # a match must sit on a token boundary, not inside the bytes of two tokens
    assert find_contained_cut([256, 0], [1, 0, 0], 1) == 1


def test_edit_prompts_ask_for_a_rewrite_with_one_edit() -> None:
    prompts = edit_prompts(5)
    assert len(prompts) == 5 and prompts[0] != prompts[1] and prompts[4] == prompts[0]
    text = prompts[1][0]["content"]
    assert '"Monday" becomes "Tuesday"' in text and "Maria will write" in text


@pytest.mark.integration
@pytest.mark.slow
def test_bench_spec_writes_b9_with_ngram_and_a_draft_model(run_root: Path,
                                                          tmp_path: Path) -> None:
    from tessera.benchmarks import speculative

    target = tmp_path / "tiny.json"
    target.write_text(json.dumps(TINY))
    draft = tmp_path / "tiny1.json"
    draft.write_text(json.dumps({**TINY, "num_hidden_layers": 1}))
    rc = speculative.main(["--model", str(target), "--load-format", "dummy", "--hal", "cpu",
                           "--prompt-len", "48", "--output-len", "16", "--iters", "2",
                           "--warmup", "0", "--self-prompt-len", "32", "--self-search-len",
                           "320", "--self-chunk", "64", "--draft-model", str(draft),
                           "--max-running-requests", "4", "--out-dir", str(tmp_path),
                           "--name", "b9"])
    assert rc == 0
    result = json.loads((tmp_path / "b9.json").read_text())
    assert result["workload"] == "B9" and not missing_figures(result)
    f = result["figures"]
    assert f["copy_workload"] == "model" and f["algorithm"] == "ngram"
    # the copy part ran on a model of the same shape that repeats its last token
    assert f["copying_model"]["repeats_last_token"] is True
    # its speculative engine verified, chaining verifies on the one in flight (every proposal
    # of a model that repeats its last token is kept)
    copy_stats = f["copying_model"]["scheduler_spec_stats"]
    assert copy_stats["spec_verify_steps_total"] > 0 and copy_stats["spec_chained_steps_total"] > 0
    # speculation changes no greedy token, for either proposer, on either workload
    for key in ("same_tokens_copy", "same_tokens_random", "draft_same_tokens_random"):
        assert f[key] is True, key
    # prompt lookup finds the repeats: several tokens per step on the copy prompts
    assert f["copy_tokens_per_step"] > 2.0
    for key in ("copy_speedup", "random_ratio", "draft_random_ratio",
                "plain_b1_decode_ms_per_step"):
        assert math.isfinite(f[key]) and f[key] > 0, key
    parts = f["parts"]
    assert set(parts) == {"plain", "ngram", "draft"} and set(parts["draft"]) == {"random"}
    assert parts["plain"]["copy"]["tokens_per_step"] == 1.0  # no speculation: one a step
    assert all(r["completion_tokens"] == 16 for r in parts["ngram"]["random"]["requests"])
    assert result["config"]["speculative"]["draft"]["speculative_draft_model"].endswith(
        "tiny1.json")


@pytest.mark.integration
@pytest.mark.slow
def test_a_failing_draft_engine_keeps_the_ngram_figures(run_root: Path, tmp_path: Path) -> None:
    from tessera.benchmarks import speculative

    target = tmp_path / "tiny.json"
    target.write_text(json.dumps(TINY))
    rc = speculative.main(["--model", str(target), "--load-format", "dummy", "--hal", "cpu",
                           "--prompt-len", "16", "--output-len", "8", "--iters", "1",
                           "--warmup", "0", "--copy", "self", "--self-prompt-len", "16",
                           "--self-search-len", "128", "--self-chunk", "64", "--draft-model",
                           str(tmp_path / "missing.json"), "--max-running-requests", "4",
                           "--out-dir", str(tmp_path), "--name", "b9"])
    assert rc == 0
    f = json.loads((tmp_path / "b9.json").read_text())["figures"]
    assert "missing.json" in f["failed_engines"]["draft"]
    assert f["copy_speedup"] > 0 and f["random_ratio"] > 0 and f["same_tokens_copy"] is True
    assert "draft_copy_speedup" not in f and set(f["parts"]) == {"plain", "ngram"}
