"""The one-token fusion in a served model on the cuda plugin (bf16, quantized at load): a
decode step of one request runs every layer's four products as the native GEMV with the
norms as prologues and the residual adds and SiLU as epilogues
(LlamaDecoderLayer.forward_one_token), inside the captured decode graphs, and gives the plain
path's greedy tokens. bf16 rounds the normed x where the plain path rounds it, so a step
whose two best tokens the plain path scores within a hair of each other may go either way:
there the comparison stops (and it must be such a near-tie)."""

from __future__ import annotations

import pytest
import torch

from tests.worker_proc.driver import MiniScheduler
from tests.worker_proc.helpers import make_runner, prompts, tiny_hf_model

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

NEW = 24
NEAR_TIE = 0.02  # nats between the plain path's two best tokens
LOGPROB_ATOL = 0.03


@pytest.mark.parametrize("scheme", ["fp8", "int4"])
def test_one_token_fusion_serves_the_plain_tokens(tmp_path, monkeypatch, scheme: str) -> None:
    from tessera.hal.cuda import nvrtc, quant_linear
    from tessera.worker_proc.models.llama import LlamaDecoderLayer

    if not nvrtc.available():
        pytest.skip("the fusion needs cuda-python (cuda.bindings) on this machine")
    ran: list[int] = []
    real = LlamaDecoderLayer.forward_one_token

    def counted(self, x, inp, kv):  # type: ignore[no-untyped-def]
        ran.append(x.shape[0])
        return real(self, x, inp, kv)

    monkeypatch.setattr(LlamaDecoderLayer, "forward_one_token", counted)
    folder = str(tmp_path / "m")
    model = tiny_hf_model("llama31", folder, rope_scaling=None)
    try:
        # every fusion, for int4 too (auto leaves int4 plain: quant_linear.AUTO_SCHEMES)
        monkeypatch.setenv(quant_linear.FUSION_VARIABLE, "all")
        quant_linear.fusion_mode.cache_clear()
        fused = make_runner(folder, hal="cuda", dtype="bfloat16", quantization=scheme)
        assert fused.graphs is not None and fused.model.fuses_one_token()
        assert ran  # the batch-1 decode graph was captured through the fused layers
        # the plain runner, its graphs captured with the fusion switched off
        monkeypatch.setenv(quant_linear.FUSION_VARIABLE, "0")
        quant_linear.fusion_mode.cache_clear()
        plain = make_runner(folder, hal="cuda", dtype="bfloat16", quantization=scheme)
        assert not plain.model.fuses_one_token()
    finally:
        monkeypatch.delenv(quant_linear.FUSION_VARIABLE)
        quant_linear.fusion_mode.cache_clear()
    compared = 0
    for seed, length in ((1, 9), (2, 30), (3, 57)):
        one = prompts(model.config.vocab_size, [length], seed=seed)
        params = [{"logprobs": 2}]
        got = MiniScheduler(fused).generate(one, NEW, params)[0]
        want = MiniScheduler(plain).generate(one, NEW, params)[0]
        for i, (a, b) in enumerate(zip(got.out, want.out, strict=True)):
            lps = want.top[i][1]
            if a != b:
                assert float(lps[0] - lps[1]) < NEAR_TIE, (seed, i, a, b, lps)
                break
            assert abs(got.logprobs[i] - want.logprobs[i]) < LOGPROB_ATOL, (seed, i)
            compared += 1
    assert compared >= 2 * NEW  # most steps compared, not cut short by near-ties
