"""ModelRunner: same logits from a GGUF and a safetensors folder of the same weights, dummy
weights, clear load errors, reproducible seeded sampling, logprobs through a real step."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tessera.formats import ModelFormatError, WeightShapeError, hf_tensor_shapes, open_model
from tests.formats.gguf_helpers import write_gguf
from tests.worker_proc.driver import MiniScheduler
from tests.worker_proc.helpers import hf_last_logits, make_runner, prompts, tiny_hf_model


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    model = tiny_hf_model("llama31", str(folder))
    return str(folder), model


def save_as_folder(files, folder) -> None:
    from safetensors.torch import save_file

    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(files.config.to_hf_dict()))
    save_file(dict(files.iter_tensors(progress=False)), str(folder / "model.safetensors"))


@pytest.mark.parametrize("quant", ["F32", "Q8_0"])
def test_gguf_and_safetensors_of_same_weights_give_same_logits(tmp_path, quant):
    model = tiny_hf_model("llama31", str(tmp_path / "src"), rope_scaling=None)
    gguf_path = str(tmp_path / "m.gguf")
    write_gguf(gguf_path, "llama", model.config, model.state_dict(), quant=quant)
    # The folder holds exactly the GGUF's (dequantized) weights.
    save_as_folder(open_model(gguf_path), tmp_path / "same")
    batch = prompts(256, [5, 13, 30])
    from_gguf = MiniScheduler(make_runner(gguf_path, quantization="none")).prefill_logits(
        batch)
    from_folder = MiniScheduler(make_runner(str(tmp_path / "same"))).prefill_logits(batch)
    assert from_gguf.shape == (3, 256)
    assert torch.equal(from_gguf, from_folder)
    # Kept quantized (the default): the same values, multiplied block by block
    kept = MiniScheduler(make_runner(gguf_path)).prefill_logits(batch)
    torch.testing.assert_close(kept, from_folder, atol=1e-4, rtol=1e-4)
    if quant == "F32":  # and both equal transformers' logits on the source weights
        for i, p in enumerate(batch):
            assert torch.allclose(from_gguf[i], hf_last_logits(model, p), atol=1e-4)


def test_sharded_checkpoint_loads_like_a_single_file(tmp_path, llama_folder):
    folder, model = llama_folder
    model.save_pretrained(str(tmp_path / "sharded"), safe_serialization=True,
                          max_shard_size="50KB")
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 1
    batch = prompts(256, [9, 20])
    one = MiniScheduler(make_runner(folder)).prefill_logits(batch)
    many = MiniScheduler(make_runner(str(tmp_path / "sharded"))).prefill_logits(batch)
    assert torch.equal(one, many)


def test_dummy_weights_are_seeded_and_sane(tmp_path, llama_folder):
    folder, _ = llama_folder
    config_json = tmp_path / "bench.json"
    config_json.write_text(open(folder + "/config.json").read())
    batch = prompts(256, [6, 11])
    a = MiniScheduler(make_runner(str(config_json), load_format="dummy", seed=3))
    b = MiniScheduler(make_runner(folder, load_format="dummy", seed=3))
    c = MiniScheduler(make_runner(folder, load_format="dummy", seed=4))
    la, lb, lc = (s.prefill_logits(batch) for s in (a, b, c))
    assert torch.equal(la, lb)
    assert not torch.equal(la, lc)
    assert torch.isfinite(la).all() and la.abs().max() < 50
    assert [r.out for r in a.generate(batch, 4)] == [r.out for r in b.generate(batch, 4)]


def test_shape_mismatch_and_missing_tensors_are_clear_errors(tmp_path, llama_folder):
    folder, _ = llama_folder
    cfg = json.loads(open(folder + "/config.json").read())
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    (wrong / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 96}))
    (wrong / "model.safetensors").write_bytes(open(folder + "/model.safetensors", "rb").read())
    with pytest.raises(WeightShapeError, match=r"mlp\..* has shape \(64, 128\) but the model config implies \(64, 96\)"):
        make_runner(str(wrong))
    from safetensors.torch import load_file, save_file

    state = load_file(folder + "/model.safetensors")
    del state["model.layers.1.mlp.up_proj.weight"]
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "config.json").write_text(json.dumps(cfg))
    save_file(state, str(partial / "model.safetensors"))
    with pytest.raises(ModelFormatError, match="lacks 1 tensor.*layers.1.mlp.up_proj"):
        make_runner(str(partial))


def test_seeded_sampling_is_reproducible_and_logprobs_are_returned(llama_folder):
    folder, model = llama_folder
    batch = prompts(256, [4, 9, 15, 22])
    params = [dict(temperature=0.9, top_p=0.95, top_k=50, seed=100 + i, logprobs=3)
              for i in range(4)]
    first = MiniScheduler(make_runner(folder)).generate(batch, 12, params)
    second = MiniScheduler(make_runner(folder), chunk_size=8).generate(batch[::-1], 12,
                                                                       params[::-1])
    assert [r.out for r in first] == [r.out for r in second[::-1]]
    assert len({tuple(r.out) for r in first}) == 4
    for r in first:
        assert len(r.logprobs) == 12 and all(lp <= 0 for lp in r.logprobs)
        assert all(len(ids) == 3 for ids, _ in r.top)
        # The top-1 alternative is at least as likely as the sampled token.
        assert all(lps[0] >= lp - 1e-6 for (_, lps), lp in zip(r.top, r.logprobs, strict=True))
    # First token's logprob equals transformers' log_softmax at the prompt's end.
    ref = torch.log_softmax(hf_last_logits(model, batch[0]), -1)[first[0].out[0]]
    assert abs(first[0].logprobs[0] - float(ref)) < 1e-4


def test_ready_message_reports_the_arena(llama_folder):
    folder, _ = llama_folder
    runner = make_runner(folder, max_total_tokens=1000, page_size=8)
    ready = runner.ready_message()
    assert ready.num_slots == runner.kv.num_slots == 1008  # 1000 rounded to pages + page 0
    assert ready.page_size == 8 and ready.vocab_size == 256 and ready.eos_token_ids == [2]
    # --overlap-steps auto, resolved against the cpu plugin's choice
    assert runner.config.overlap_steps == 0 and ready.overlap_steps == 2
    assert make_runner(folder, max_total_tokens=64, overlap_steps=3).ready_message() \
        .overlap_steps == 3
    assert runner.kv.k[0].shape == (1008, 2, 16)
    assert np.asarray(runner.kv.storage.shape).prod() * 4 == runner.kv_plan.total_bytes


def test_decode_graphs_are_captured_and_replayed_with_the_same_tokens(llama_folder,
                                                                       monkeypatch):
    """An out-of-tree plugin that captures graphs (tests/hal_plugin_example: a recording of
    aten ops, its own events) through the Platform contract alone: the runner captures decode
    and mixed-step graphs at start-up and replays them; batches larger than the largest graph
    run eagerly. Tokens are those of the eager cpu plugin."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "hal_plugin_example"))
    from tessera_hal_example import ExamplePlatform

    class SmallGraphs(ExamplePlatform):
        capabilities = dataclasses.replace(ExamplePlatform.capabilities, max_capture_batch=4)

    folder, model = llama_folder
    from tessera.worker_proc.model_runner import ModelRunner

    eager = make_runner(folder)
    config = eager.config.replace(graph_max_bs=8, graph_max_tokens=64)
    runner = ModelRunner(config, 0, SmallGraphs())
    assert runner.graphs is not None and runner.graphs.sizes == [1, 2, 4]
    assert runner.graphs.runner.tapes.keys() == {1, 2, 4}
    assert runner.mixed_graphs is not None and runner.mixed_graphs.captured == {32, 64}
    calls = []
    run = runner.graphs.run
    runner.graphs.run = lambda inp: calls.append(int(inp.seq_lens.shape[0])) or run(inp)
    small, large = prompts(256, [3, 8, 13]), prompts(256, [2, 4, 6, 9, 11], seed=5)
    got = [r.out for r in MiniScheduler(runner).generate(small, 6)]
    assert calls == [3] * 5  # every decode step of 3 requests replayed the size-4 graph
    assert got == [r.out for r in MiniScheduler(eager).generate(small, 6)]
    got_large = [r.out for r in MiniScheduler(runner).generate(large, 4)]
    assert calls == [3] * 5  # 5 requests exceed the largest graph: eager
    assert got_large == [r.out for r in MiniScheduler(eager).generate(large, 4)]


def test_bfloat16_serving_stays_close_to_float32(llama_folder):
    folder, _ = llama_folder
    batch = prompts(256, [7, 19])
    fp32 = MiniScheduler(make_runner(folder)).prefill_logits(batch)
    bf16_runner = make_runner(folder, dtype="bfloat16")
    assert bf16_runner.kv.storage.dtype == torch.bfloat16
    bf16 = MiniScheduler(bf16_runner).prefill_logits(batch)
    assert bf16.dtype == torch.float32  # the sampler always gets float32 logits
    # bf16 keeps 8 bits of mantissa: logits of this 2-layer model agree to a few percent.
    assert (bf16 - fp32).abs().max() < 0.05 * fp32.abs().max()
    assert (bf16.argmax(-1) == fp32.argmax(-1)).all()


def test_default_model_with_dummy_weights_keeps_its_config():
    files = open_model("default", load_format="dummy", seed=0)
    assert files.kind == "dummy" and files.config == open_model("default").config
    name, tensor = next(iter(files.iter_tensors(progress=False)))
    assert tuple(tensor.shape) == hf_tensor_shapes(files.config)[name]


def test_prefill_and_mixed_steps_replay_token_bucket_graphs(llama_folder):
    """Where decode graphs are captured, steps with prefill chunks of up to --graph-max-tokens
    tokens replay the graph of their token bucket (the stand-in runner reruns the captured
    callable on the static buffers), and so do decode batches too large for the decode graphs;
    longer steps run eagerly. Tokens do not change."""
    from tessera.hal.cpu import CpuPlatform
    from tests.worker_proc.test_graph_decode import RerunRunner

    class CapturingCpu(CpuPlatform):
        capabilities = dataclasses.replace(CpuPlatform.capabilities, graph_capture=True,
                                           max_capture_batch=4)

        def create_graph_runner(self):
            return RerunRunner()

    folder, _ = llama_folder
    from tessera.worker_proc.model_runner import ModelRunner

    eager = make_runner(folder)
    runner = ModelRunner(eager.config.replace(graph_max_tokens=64), 0, CapturingCpu())
    assert runner.mixed_graphs is not None and runner.mixed_graphs.buckets == [32, 64]
    # the scheduler is told the sizes its prefill steps run padded to (and the eager runner
    # that every step runs at its own count)
    assert runner.ready_message().step_token_sizes == [32, 64]
    assert eager.ready_message().step_token_sizes == []
    tokens = []
    run = runner.mixed_graphs.run
    runner.mixed_graphs.run = lambda inp: tokens.append(inp.num_tokens) or run(inp)
    ran = []  # (tokens, what the step ran as): the worker's trace reports the second
    step_logits = runner.step_logits

    def recorded(inp):
        out = step_logits(inp)
        ran.append((inp.num_tokens, runner.padded_tokens))
        return out

    runner.step_logits = recorded

    chunked = prompts(256, [3, 50, 90], seed=2)  # 40 prefill tokens per step at most
    got = [r.out for r in MiniScheduler(runner, chunk_size=40).generate(chunked, 4)]
    assert got == [r.out for r in MiniScheduler(eager, chunk_size=40).generate(chunked, 4)]
    assert tokens == [41, 41, 42, 24]  # decodes and chunks; then 3 decodes: decode graph
    # the mixed steps ran as their token buckets; the decodes after them (requests ending:
    # 2, then 1) as the decode graph of their padded batch
    assert [p for t, p in ran if t in (41, 42, 24)] == [64, 64, 64, 32]
    decodes = [(t, p) for t, p in ran if t <= 4]
    assert decodes and all(p == runner.graphs.padded_size(t) for t, p in decodes), ran
    tokens.clear()
    five = prompts(256, [2, 4, 6, 9, 11], seed=5)  # one prefill step of 32 tokens
    got = [r.out for r in MiniScheduler(runner).generate(five, 3)]
    assert got == [r.out for r in MiniScheduler(eager).generate(five, 3)]
    assert tokens == [32, 5, 5]  # 5 decodes exceed the decode graphs: a mixed graph
    tokens.clear()
    long = prompts(256, [70], seed=6)
    got = [r.out for r in MiniScheduler(runner).generate(long, 2)]
    assert got == [r.out for r in MiniScheduler(eager).generate(long, 2)]
    assert tokens == []  # 70 tokens: eager; one decode: the decode graph


def test_profile_ranges_mark_each_step_phase_only_when_asked(llama_folder):
    import contextlib

    from tessera.hal.cpu import CpuPlatform
    from tessera.worker_proc.model_runner import ModelRunner

    opened: list[str] = []

    class Recording(CpuPlatform):
        def profile_range(self, name):
            opened.append(name)
            return contextlib.nullcontext()

    folder, _ = llama_folder
    base = make_runner(folder).config
    batch = prompts(256, [5, 9])
    quiet = MiniScheduler(ModelRunner(base, 0, Recording())).generate(batch, 2)
    assert opened == []
    marked = MiniScheduler(ModelRunner(base.replace(profile_ranges=True), 0, Recording())
                           ).generate(batch, 2)
    assert opened[:5] == ["step", "inputs", "forward", "sample", "copy-out"]
    assert len(opened) == 5 * 2  # a prefill step and a decode step
    assert [r.out for r in marked] == [r.out for r in quiet]
