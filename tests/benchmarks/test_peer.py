"""The transformers peer gets the very weights tessera reads, and generates exactly the
number of tokens asked (EOS ignored)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tessera.benchmarks.hf_peer import generate, load_peer  # noqa: E402


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, object]:
    folder = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      vocab_size=256, max_position_embeddings=256,
                                      bos_token_id=1, eos_token_id=2, initializer_range=0.1)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(folder, safe_serialization=True)
    return str(folder), model


def test_peer_has_the_checkpoint_weights(tiny_folder: tuple[str, object]) -> None:
    folder, original = tiny_folder
    peer = load_peer(folder, "auto", "float32", "cpu")
    ids = torch.tensor([[5, 17, 99, 3, 42]])
    with torch.no_grad():
        assert torch.allclose(peer(ids).logits, original(ids).logits, atol=1e-5)  # type: ignore[operator]


def test_generate_counts_tokens_and_batches(tiny_folder: tuple[str, object]) -> None:
    peer = load_peer(tiny_folder[0], "auto", "float32", "cpu")
    one = generate(peer, [[2, 2, 2, 7]], 6)  # EOS (2) everywhere, still 6 tokens
    assert one.output_tokens == 6 and one.steps == 6 and len(one.token_ids) == 6
    assert 0 < one.ttft_s <= one.seconds and one.decode_ms_per_step > 0
    batch = generate(peer, [[5, 6, 7], [8, 9, 10]], 4)
    assert batch.output_tokens == 8 and batch.steps == 4
    with pytest.raises(ValueError, match="one length"):
        generate(peer, [[1, 2], [3]], 2)


def test_dummy_peer_takes_the_config_shape(tmp_path: Path) -> None:
    cfg = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
           "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
           "vocab_size": 128, "max_position_embeddings": 64}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    peer = load_peer(str(path), "dummy", "float32", "cpu")
    assert peer.config.num_hidden_layers == 1 and peer.lm_head.weight.shape == (128, 32)


@pytest.mark.integration
@pytest.mark.slow
def test_c1_reports_the_median_run_its_spread_and_cpu_per_token(
        tmp_path: Path, run_root: Path) -> None:
    from tessera.benchmarks.peer import main_c1
    from tests.benchmarks.test_bench_quant import TINY

    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(TINY))
    rc = main_c1(["--model", str(config), "--load-format", "dummy", "--hal", "cpu",
                  "--num-requests", "3",
                  "--output-len", "4", "--prompt-len", "4,12", "--peer-requests", "2",
                  "--runs", "3", "--out-dir", str(tmp_path), "--name", "c1"])
    assert rc == 0
    result = json.loads((tmp_path / "c1.json").read_text())
    f = result["figures"]
    runs = f["runs"]
    assert len(runs) == 3 and all(r["output_tokens"] == 12 for r in runs)
    speedups = sorted(r["speedup_vs_peer"] for r in runs)
    assert f["speedup_vs_peer"] == speedups[1]  # the median run's figures
    assert (f["speedup_min"], f["speedup_max"]) == (speedups[0], speedups[2])
    for r in runs:
        assert r["cpu_ms_per_token"] > 0 and r["peer_cpu_ms_per_token"] > 0
        assert r["cpu_efficiency_vs_peer"] == pytest.approx(
            r["peer_cpu_ms_per_token"] / r["cpu_ms_per_token"])
    assert f["cpu_efficiency_min"] <= f["cpu_efficiency_median"] <= f["cpu_efficiency_max"]
