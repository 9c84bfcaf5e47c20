from __future__ import annotations

import numpy as np
import pytest
import torch

from tessera.formats import ModelFormatError, UnsupportedModelError, open_model
from tessera.formats.gguf_file import permute_qk, read_gguf_metadata, unpermute_qk
from tests.formats.gguf_helpers import write_gguf
from tests.worker_proc.helpers import tiny_hf_model


def test_unpermute_inverts_llama_cpp_permutation():
    w = torch.randn(4 * 8, 5)
    b = torch.randn(4 * 8)
    assert torch.equal(unpermute_qk(permute_qk(w, 4), 4), w)
    assert torch.equal(unpermute_qk(permute_qk(b, 4), 4), b)
    assert not torch.equal(permute_qk(w, 4), w)


@pytest.mark.parametrize("kind,arch", [("llama31", "llama"), ("qwen2", "qwen2"),
                                       ("qwen3", "qwen3")])
def test_gguf_tensors_equal_hf_tensors(tmp_path, kind, arch):
    model = tiny_hf_model(kind, str(tmp_path / "hf"), rope_scaling=None)
    path = str(tmp_path / "m.gguf")
    write_gguf(path, arch, model.config, model.state_dict())
    files = open_model(path)
    hf = open_model(str(tmp_path / "hf"))
    cfg = files.config
    assert cfg.arch == hf.config.arch
    for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                 "intermediate_size", "vocab_size", "rms_norm_eps", "rope_theta",
                 "tie_word_embeddings", "qkv_bias", "qk_norm"):
        assert getattr(cfg, name) == getattr(hf.config, name), name
    got = dict(files.iter_tensors(torch.float32, progress=False))
    want = dict(hf.iter_tensors(torch.float32, progress=False))
    assert set(got) == set(want)
    for name in want:
        assert torch.equal(got[name], want[name]), name


def test_quantized_gguf_dequantizes_close_to_source(tmp_path):
    model = tiny_hf_model("llama31", str(tmp_path / "hf"), rope_scaling=None)
    path = str(tmp_path / "q.gguf")
    write_gguf(path, "llama", model.config, model.state_dict(), quant="Q8_0")
    got = dict(open_model(path).iter_tensors(progress=False))
    state = model.state_dict()
    q = got["model.layers.0.self_attn.q_proj.weight"]
    want = state["model.layers.0.self_attn.q_proj.weight"]
    # Q8_0: int8 per weight, one fp16 scale (amax / 127) per block of 32. Error <= half a
    # step, plus the fp16 rounding of the scale (2^-11 relative) times up to 127 steps.
    step = want.abs().reshape(-1, 32).amax(dim=1, keepdim=True) / 127
    assert ((q - want).abs().reshape(-1, 32) <= step * (0.5 + 127 * 2**-11)).all()
    assert not torch.equal(q, want)


def test_unsupported_gguf_architecture_is_a_clear_error(tmp_path):
    import gguf

    path = str(tmp_path / "x.gguf")
    w = gguf.GGUFWriter(path, "mamba")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModelError, match="mamba"):
        open_model(path)


def test_missing_and_corrupt_gguf(tmp_path):
    with pytest.raises(ModelFormatError, match="not found"):
        open_model(str(tmp_path / "nope.gguf"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelFormatError, match="not a readable GGUF"):
        open_model(str(bad))


def test_default_model_config_and_tokenizer_metadata():
    files = open_model("default")
    cfg = files.config
    assert (cfg.arch, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads) == \
        ("llama", 576, 30, 9, 3)
    assert cfg.tie_word_embeddings and cfg.rms_norm_eps == 1e-5 and cfg.rope_theta == 1e5
    meta = files.gguf_metadata
    assert meta is not None
    assert len(meta["tokenizer.ggml.tokens"]) == cfg.vocab_size
    assert meta["tokenizer.ggml.tokens"][cfg.eos_token_ids[0]] == "<|im_end|>" or \
        meta["tokenizer.ggml.tokens"][cfg.eos_token_ids[0]].startswith("<|")
    assert isinstance(meta["tokenizer.chat_template"], str)
    assert "im_start" in meta["tokenizer.chat_template"]
    assert read_gguf_metadata(files.path)["general.architecture"] == "llama"


def test_llama31_gguf_rope_freqs_tensor_becomes_llama3_scaling(tmp_path):
    from tests.formats.gguf_helpers import llama3_rope_factors
    from tests.worker_proc.driver import MiniScheduler
    from tests.worker_proc.helpers import hf_last_logits, make_runner, prompts

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    model = tiny_hf_model("llama31", str(tmp_path / "hf"), rope_scaling=dict(scaling))
    path = str(tmp_path / "l31.gguf")
    freqs = llama3_rope_factors(16, 500000.0, 8.0, 1.0, 4.0, 8192)
    assert 1.0 < float(np.median(freqs)) < 8.0  # the tiny head spans all three bands
    write_gguf(path, "llama", model.config, model.state_dict(), rope_freqs=freqs)
    files = open_model(path)
    assert files.config.rope_scaling == scaling
    assert "rope_freqs.weight" not in files.tensor_names()
    batch = prompts(256, [9, 40])
    logits = MiniScheduler(make_runner(path)).prefill_logits(batch)
    for i, p in enumerate(batch):
        assert torch.allclose(logits[i], hf_last_logits(model, p), atol=1e-4)
    # Factors that are not Llama 3's are refused with a clear message.
    write_gguf(str(tmp_path / "odd.gguf"), "llama", model.config, model.state_dict(),
               rope_freqs=freqs * 1.5)
    with pytest.raises(UnsupportedModelError, match="rope_freqs"):
        open_model(str(tmp_path / "odd.gguf"))
