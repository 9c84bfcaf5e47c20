"""DecodeGraphs (worker_proc/graph_decode.py) on the CPU: static buffers, padding rows and
output views, with a stand-in runner that "replays" by rerunning the captured callable on the
static buffers (what a CUDA graph does on the device; tests/hal_cuda covers the real one)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tessera.formats.config import ModelConfig
from tessera.formats.layout import hf_tensor_shapes
from tessera.hal.cpu import CpuPlatform
from tessera.worker_proc.forward_inputs import ForwardInputs
from tessera.worker_proc.graph_decode import DecodeGraphs, capture_batch_sizes, padded_batch_size
from tessera.worker_proc.models.llama import LlamaForCausalLM

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 8, "intermediate_size": 64, "vocab_size": 50, "rms_norm_eps": 1e-5,
          "rope_theta": 10000.0, "max_position_embeddings": 64, "tie_word_embeddings": False}
WIDTH = 32  # page-table row length; row r owns slots (r + 1) * WIDTH ...


class RerunRunner:
    """capture() runs fn once and keeps its output; replay() reruns fn into that output."""

    def __init__(self) -> None:
        self.fns: dict[Any, Callable[[], torch.Tensor]] = {}
        self.outputs: dict[Any, torch.Tensor] = {}

    def capture(self, key: Any, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        self.fns[key] = fn
        self.outputs[key] = fn()
        return self.outputs[key]

    def replay(self, key: Any) -> None:
        with torch.inference_mode():  # the output was made under inference mode
            self.outputs[key].copy_(self.fns[key]())


@pytest.fixture(scope="module")
def setup() -> tuple[Callable[[ForwardInputs], torch.Tensor], Any]:
    mc = ModelConfig.from_hf_dict(CONFIG)
    platform = CpuPlatform()
    model = LlamaForCausalLM(mc, platform, dtype=torch.float32, device=torch.device("cpu"),
                             max_positions=64)
    gen = torch.Generator().manual_seed(0)
    model.load_weights((name, torch.randn(shape, generator=gen) * 0.2)
                       for name, shape in hf_tensor_shapes(mc).items())
    kv = platform.create_kv_arena(2, 8 * WIDTH, 2, 8, torch.float32)
    kv.storage[:, :, WIDTH:].normal_(generator=gen)  # page 0 (slots < WIDTH here) stays 0

    def forward(inp: ForwardInputs) -> torch.Tensor:
        with torch.inference_mode():
            return model(inp, kv)
    return forward, kv


def decode_inputs(rows: list[int], lens: list[int], ids: list[int]) -> ForwardInputs:
    b = len(rows)
    table = torch.stack([torch.arange(WIDTH, dtype=torch.int32) + (r + 1) * WIDTH
                         for r in rows])
    positions = torch.tensor(lens) - 1
    return ForwardInputs(
        input_ids=torch.tensor(ids), token_rows=torch.tensor(rows), positions=positions,
        out_slots=table[torch.arange(b), positions].long(), req_to_token=table,
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        extend_lens=torch.ones(b, dtype=torch.int32),
        qo_indptr=torch.arange(b + 1, dtype=torch.int32),
        logits_indices=torch.arange(b), is_decode=True)


def test_padded_replay_matches_eager_and_touches_only_its_slots(setup: Any) -> None:
    forward, kv = setup
    graphs = DecodeGraphs(forward, RerunRunner(), 4, WIDTH, torch.device("cpu"),
                          sizes=[1, 2, 4])
    graphs.capture_all()
    assert sorted(graphs.outputs) == [1, 2, 4]
    # a full batch first, so that the padded batch after it finds stale rows to reset
    for rows, lens, ids in (([0, 3, 5, 6], [5, 17, 30, 12], [1, 2, 3, 4]),
                            ([1, 4, 2], [32, 1, 9], [4, 9, 7]), ([2], [9], [7])):
        inp = decode_inputs(rows, lens, ids)
        assert graphs.can_run(inp)
        before = kv.storage.clone()
        replayed = graphs.run(inp).clone()
        assert graphs.last_bucket == graphs.padded_size(len(rows))  # the trace's padded size
        after_replay = kv.storage.clone()
        kv.storage.copy_(before)
        eager = forward(inp)
        torch.testing.assert_close(replayed, eager, rtol=1e-5, atol=1e-5)
        # the replay wrote the real rows' slots and, for padding rows, only slot 0
        changed = (after_replay != before).flatten(3).any(-1).any(0).any(0)  # [slots]
        written = set(changed.nonzero().flatten().tolist())
        assert set(inp.out_slots.tolist()) <= written <= set(inp.out_slots.tolist()) | {0}
        kv.storage.copy_(after_replay)


def test_can_run_refuses_what_no_graph_holds(setup: Any) -> None:
    forward, _ = setup
    graphs = DecodeGraphs(forward, RerunRunner(), 2, WIDTH, torch.device("cpu"), sizes=[1, 2])
    graphs.capture_all()
    assert not graphs.can_run(decode_inputs([0, 1, 2], [3, 3, 3], [1, 1, 1]))  # too many rows
    prefill = decode_inputs([0], [3], [1])
    prefill.is_decode = False
    assert not graphs.can_run(prefill)
    with pytest.raises(ValueError, match="no graph"):
        graphs.run(decode_inputs([0, 1, 2], [3, 3, 3], [1, 1, 1]))


def test_capture_batch_sizes() -> None:
    assert capture_batch_sizes(1) == [1]
    assert capture_batch_sizes(6) == [1, 2, 4, 6]
    assert capture_batch_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    sizes = capture_batch_sizes(256)
    assert sizes[:4] == [1, 2, 4, 8] and sizes[-1] == 256
    assert sizes == sorted(set(sizes))
    assert all(b - a in (8, 16) for a, b in zip(sizes[3:], sizes[4:], strict=False))
    assert capture_batch_sizes(100)[-2:] == [96, 100]


def test_padded_batch_size() -> None:
    sizes = capture_batch_sizes(64)
    assert padded_batch_size(1, sizes) == 1
    assert padded_batch_size(3, sizes) == 4
    assert padded_batch_size(9, sizes) == 16
    assert padded_batch_size(64, sizes) == 64
    assert padded_batch_size(65, sizes) is None


@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "scaled"])
def test_graphs_keep_the_lm_heads_dtype_where_nothing_scales_it(scaled: bool) -> None:
    """float32=False (the decode graphs' forward): a bf16 model's logits stay bf16, the very
    values of its float32 logits, and so does the graphs' shared buffer; a config that
    scales its logits (Granite) still gets float32 (the scaling works on the wide values)."""
    mc = ModelConfig.from_hf_dict(CONFIG)
    if scaled:
        mc = dataclasses.replace(mc, logits_scaling=3.0)
    platform = CpuPlatform()
    model = LlamaForCausalLM(mc, platform, dtype=torch.bfloat16, device=torch.device("cpu"),
                             max_positions=64)
    gen = torch.Generator().manual_seed(0)
    model.load_weights((name, (torch.randn(shape, generator=gen) * 0.2).to(torch.bfloat16))
                       for name, shape in hf_tensor_shapes(mc).items())
    kv = platform.create_kv_arena(2, 8 * WIDTH, 2, 8, torch.bfloat16)
    inp = decode_inputs([0, 1], [3, 5], [4, 9])
    with torch.inference_mode():
        wide = model(inp, kv)
        raw = model(inp, kv, float32=False)
        graphs = DecodeGraphs(lambda i: model(i, kv, float32=False), RerunRunner(), 2, WIDTH,
                              torch.device("cpu"), sizes=[2])
        graphs.capture_all()
        replayed = graphs.run(inp)
    assert wide.dtype == torch.float32
    assert raw.dtype == (torch.float32 if scaled else torch.bfloat16)
    assert replayed.dtype == raw.dtype
    assert torch.equal(raw.float(), wide) and torch.equal(replayed.float(), wide)
