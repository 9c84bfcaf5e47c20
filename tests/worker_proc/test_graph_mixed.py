"""MixedGraphs (worker_proc/graph_mixed.py) on the CPU: token buckets, static buffers, padding
tokens and requests, output views, with the stand-in runner of test_graph_decode that
"replays" by rerunning the captured callable on the static buffers (tests/hal_cuda and
tests/hal_cuda/gpu_step_profile.py cover real graphs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from tessera.formats.config import ModelConfig
from tessera.formats.layout import hf_tensor_shapes
from tessera.hal.cpu import CpuPlatform
from tessera.worker_proc.forward_inputs import ForwardInputs
from tessera.worker_proc.graph_mixed import MixedGraphs, token_buckets
from tessera.worker_proc.models.llama import LlamaForCausalLM
from tests.worker_proc.test_graph_decode import CONFIG, WIDTH, RerunRunner


@pytest.fixture(scope="module")
def setup() -> tuple[Callable[[ForwardInputs], torch.Tensor], Any, LlamaForCausalLM]:
    """The tiny model of test_graph_decode and its KV arena (page 0: slots < WIDTH, zeros)."""
    mc = ModelConfig.from_hf_dict(CONFIG)
    platform = CpuPlatform()
    model = LlamaForCausalLM(mc, platform, dtype=torch.float32, device=torch.device("cpu"),
                             max_positions=64)
    gen = torch.Generator().manual_seed(1)
    model.load_weights((name, torch.randn(shape, generator=gen) * 0.2)
                       for name, shape in hf_tensor_shapes(mc).items())
    kv = platform.create_kv_arena(2, 8 * WIDTH, 2, 8, torch.float32)
    kv.storage[:, :, WIDTH:].normal_(generator=gen)

    def forward(inp: ForwardInputs) -> torch.Tensor:
        with torch.inference_mode():
            return model(inp, kv)
    return forward, kv, model


def mixed_graphs(setup: Any, max_tokens: int, max_requests: int,
                 buckets: list[int]) -> MixedGraphs:
    _, kv, model = setup
    return MixedGraphs(lambda inp: model.hidden(inp, kv), model.logits, RerunRunner(),
                       max_tokens, max_requests, WIDTH, torch.device("cpu"), buckets=buckets)


def step_inputs(rows: list[int], prefixes: list[int], extends: list[int],
                ids: list[int]) -> ForwardInputs:
    """Request i (page-table row rows[i]) extends by extends[i] tokens after prefixes[i]."""
    tables = torch.stack([torch.arange(WIDTH, dtype=torch.int32) + (r + 1) * WIDTH
                          for r in rows])
    ext = torch.tensor(extends)
    seq = torch.tensor(prefixes) + ext
    req = torch.repeat_interleave(torch.arange(len(rows)), ext)
    indptr = torch.zeros(len(rows) + 1, dtype=torch.int32)
    indptr[1:] = ext.cumsum(0)
    positions = torch.tensor(prefixes)[req] + torch.arange(int(ext.sum())) - indptr[req].long()
    return ForwardInputs(
        input_ids=torch.tensor(ids), token_rows=torch.tensor(rows)[req], positions=positions,
        out_slots=tables[req, positions].long(), req_to_token=tables[:, :int(seq.max())],
        seq_lens=seq.int(), extend_lens=ext.int(), qo_indptr=indptr,
        logits_indices=(indptr[1:] - 1).long(), is_decode=False,
        max_extend_len=int(ext.max()))


def test_token_buckets() -> None:
    assert token_buckets(0) == []
    assert token_buckets(20) == [20]
    assert token_buckets(100) == [32, 64, 96, 100]
    sizes = token_buckets(1024)
    assert sizes[:6] == [32, 64, 96, 128, 192, 256] and sizes[-1] == 1024
    assert sizes == sorted(set(sizes))
    assert token_buckets(2048)[-2:] == [1792, 2048]
    assert token_buckets(1100)[-2:] == [1024, 1100]


def test_padded_replay_matches_eager_and_touches_only_its_slots(setup: Any) -> None:
    forward, kv, _ = setup
    graphs = mixed_graphs(setup, 48, 4, [8, 16, 48])
    graphs.capture_all()
    assert sorted(graphs.captured) == [8, 16, 48]
    assert [graphs.requests_for(b) for b in (8, 16, 48)] == [4, 4, 4]
    # the largest first, so that the smaller steps after it find stale rows to reset
    steps = [
        ([0, 3, 5, 6], [9, 4, 0, 2], [1, 1, 30, 6], list(range(1, 39))),  # decodes + chunks
        ([1, 4], [0, 5], [11, 1], list(range(30, 42))),  # prefill, decode: bucket 16
        ([2], [3], [5], [7, 8, 9, 10, 11]),  # one chunk after a cached prefix: bucket 8
        ([2, 4, 1], [8, 7, 3], [1, 1, 1], [4, 9, 7]),  # decodes only, through attention_extend
    ]
    for rows, prefixes, extends, ids in steps:
        inp = step_inputs(rows, prefixes, extends, ids)
        assert graphs.can_run(inp)
        before = kv.storage.clone()
        replayed = graphs.run(inp).clone()
        after_replay = kv.storage.clone()
        # what the replay read beyond the step: padding requests own nothing
        bucket = graphs.bucket_for(inp.num_tokens)
        assert bucket is not None
        assert graphs.last_bucket == bucket  # what the worker's trace reports as padded
        b, t = len(rows), inp.num_tokens
        assert not graphs.seq_lens[b:4].any() and not graphs.extend_lens[b:4].any()
        assert bool((graphs.qo_indptr[b + 1:5] == t).all())
        assert not graphs.out_slots[t:bucket].any()
        kv.storage.copy_(before)
        eager = forward(inp)
        assert replayed.shape == eager.shape == (len(rows), 50)
        torch.testing.assert_close(replayed, eager, rtol=1e-5, atol=1e-5)
        # the replay wrote the real tokens' slots and, for padding tokens, only slot 0
        changed = (after_replay != before).flatten(3).any(-1).any(0).any(0)  # [slots]
        written = set(changed.nonzero().flatten().tolist())
        assert set(inp.out_slots.tolist()) <= written <= set(inp.out_slots.tolist()) | {0}
        kv.storage.copy_(after_replay)


def test_sampling_only_some_rows(setup: Any) -> None:
    """A chunk that does not end its prompt samples nothing: fewer logits rows than
    requests."""
    forward, _, _ = setup
    graphs = mixed_graphs(setup, 16, 4, [16])
    graphs.capture_all()
    inp = step_inputs([0, 1], [4, 0], [1, 9], list(range(10, 20)))
    inp.logits_indices = inp.logits_indices[:1]  # the decode samples, the chunk does not
    replayed = graphs.run(inp).clone()
    torch.testing.assert_close(replayed, forward(inp), rtol=1e-5, atol=1e-5)
    assert replayed.shape == (1, 50)


def test_can_run_refuses_what_no_graph_holds(setup: Any) -> None:
    graphs = mixed_graphs(setup, 16, 2, [8, 16])
    assert not graphs.can_run(step_inputs([0], [0], [4], [1, 2, 3, 4]))  # nothing captured
    graphs.capture_all()
    assert graphs.can_run(step_inputs([0], [0], [4], [1, 2, 3, 4]))
    assert not graphs.can_run(step_inputs([0], [0], [17], list(range(17))))  # too many tokens
    three = step_inputs([0, 1, 2], [0, 0, 0], [2, 2, 2], list(range(6)))
    assert not graphs.can_run(three)  # more requests than the bucket holds
    with pytest.raises(ValueError, match="no graph"):
        graphs.run(three)
