"""B12's pieces: the KL harness computes the model's real next-token logits, the KL math, and
`tessera bench quant` end to end on a tiny dummy shape on the cpu plugin (every part)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tessera.benchmarks.quant_kl import kl_divergence, next_token_logits, prompt_set

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "vocab_size": 512, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "max_position_embeddings": 1024, "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2}


def test_kl_of_known_distributions() -> None:
    p = torch.tensor([[0.5, 0.5], [0.9, 0.1]]).log()
    q = torch.tensor([[0.5, 0.5], [0.5, 0.5]]).log()
    result = kl_divergence(p, q)
    want = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)
    assert result.prompts == 2 and math.isclose(result.max_kl, want, rel_tol=1e-6)
    assert math.isclose(result.mean_kl, want / 2, rel_tol=1e-6)
    assert result.top1_agreement == 1.0
    assert kl_divergence(p, p).mean_kl == 0.0


def test_next_token_logits_are_the_models(tmp_path: Path) -> None:
    from tests.worker_proc.driver import MiniScheduler
    from tests.worker_proc.helpers import make_runner, tiny_hf_model

    folder = str(tmp_path / "m")
    tiny_hf_model("llama31", folder, rope_scaling=None)
    prompts = prompt_set(256, 5, seed=1, lengths=(3, 40))
    got = next_token_logits({"model": folder, "hal": "cpu", "dtype": "float32",
                             "page_size": 4}, prompts)
    want = MiniScheduler(make_runner(folder)).prefill_logits(prompts)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.integration
@pytest.mark.slow
def test_run_gpu_b12_writes_every_part_in_one_command(run_root: Path, tmp_path: Path) -> None:
    """`benchmarks/run_gpu.sh b12`, the GPU command, on a tiny shape on the cpu plugin: its
    default parts (KL, B1, B2, the fp8 KV retraction comparison) in one command."""
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(TINY))
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "run_gpu.sh"
    env = {**os.environ, "PYTHON": sys.executable, "MODEL": str(config), "OUT": str(tmp_path),
           "SUFFIX": "cpu"}
    proc = subprocess.run(
        ["bash", str(script), "b12", "--hal", "cpu", "--schemes", "fp32,fp8,int4",
         "--prompt-len", "16", "--output-len", "4", "--iters", "1", "--warmup", "0",
         "--num-requests", "6", "--b2-prompt-len", "8,24", "--b2-output-len", "4,12",
         "--kv-pool-tokens", "96", "--page-size", "4", "--kl-prompts", "4",
         "--kl-prompt-len", "4,16", "--max-running-requests", "8", "--bandwidth-gbps", "10"],
        env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "b12_cpu.json").read_text())
    assert result["workload"] == "B12"
    f = result["figures"]
    for v in ("fp32", "fp8", "int4"):
        assert f[f"{v}_decode_ms_per_step"] > 0 and f[f"{v}_b2_output_tok_per_s"] > 0
        assert f[f"{v}_roofline_decode_ms_per_step"] > 0
    # (on the cpu plugin int4 is held one value per byte: not smaller than fp8 there)
    assert max(f["int4_weight_bytes"], f["fp8_weight_bytes"]) < f["fp32_weight_bytes"]
    assert 0 < f["fp8_kl"] < f["int4_kl"] < 0.1
    assert 0 < f["kv_fp8_kl"] < 0.1  # the reference's weights over an fp8 KV cache
    assert f["fp8_b2_speedup"] > 0 and "targets" not in f  # the H200 targets
    # the same KV bytes: twice the tokens in fp8. The six requests need 148 tokens at their
    # full lengths (in pages of 4): the fp8 pool of 192 holds them all and never retracts,
    # whatever order they arrive in; whether the pool of 96 retracts depends on that order.
    assert f["kv_fp8_pool_tokens"] == 2 * f["kv_auto_pool_tokens"] == 192
    assert f["kv_fp8_retractions"] == 0


def test_variants_name_their_engine_settings() -> None:
    from tessera.benchmarks.quant import variant_kwargs

    base = {"model": "m"}
    assert variant_kwargs(base, "bf16") == {"model": "m", "quantization": "none"}
    assert variant_kwargs(base, "checkpoint")["quantization"] == "auto"
    assert variant_kwargs(base, "int4") == {"model": "m", "quantization": "int4"}
    assert variant_kwargs(base, "fp8+head") == {"model": "m", "quantization": "fp8",
                                                "quantize_lm_head": True}
    with pytest.raises(ValueError, match=r"\+head"):
        variant_kwargs(base, "fp8+embed")
