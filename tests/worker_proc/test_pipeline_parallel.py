"""Pipeline parallelism on the cpu plugin: 2 stages (and 2 stages x 2 TP ranks) of gloo
workers give transformers' greedy tokens on tiny models, tied and untied embeddings; each
stage holds its own layers, and all agree on one KV arena size."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.worker_proc.helpers import hf_greedy, prompts, tiny_hf_model

pytestmark = pytest.mark.integration


def run_workers(model_dir: str, tmp_path, tp: int, pp: int, batch: list[list[int]],
                graphs: bool = False) -> list:
    init = f"file://{tmp_path / f'rendezvous-{tp}x{pp}'}"
    world = tp * pp
    outs = [tmp_path / f"out-{tp}x{pp}-{r}.json" for r in range(world)]
    procs = [subprocess.Popen([sys.executable, "-m", "tests.worker_proc.pp_rank", model_dir,
                               str(r), str(tp), str(pp), init, str(outs[r]), json.dumps(batch),
                               "graphs" if graphs else "eager"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("pipeline workers did not finish in 300 s")
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"worker {r} failed:\n{logs[r][-3000:]}"
    return [json.loads(o.read_text()) for o in outs]


@pytest.mark.parametrize("kind,tp,graphs", [("llama31", 1, False), ("qwen2", 1, False),
                                            ("llama31", 2, True)])
def test_pipeline_stages_match_transformers(tmp_path, kind: str, tp: int, graphs: bool) -> None:
    """qwen2 ties its embeddings: the last stage holds its own copy of the table as head.
    With graphs (a stand-in runner), every step of every stage replays its token bucket's
    graph, as on a GPU; a later stage's graphs take the received hidden states. (TP x PP
    eagerly: tests/offline/test_parallel_engine.py, the whole engine.)"""
    model = tiny_hf_model(kind, str(tmp_path / "model"), num_hidden_layers=4)
    batch = prompts(256, [5, 17, 30])
    outs = run_workers(str(tmp_path / "model"), tmp_path, tp, 2, batch, graphs)
    want = [hf_greedy(model, p, 12) for p in batch]
    for out in outs:
        assert out["greedy"] == want
        if graphs:
            assert out["graph_buckets"] and out["graph_replays"] >= 12
        else:
            assert out["graph_buckets"] == [] and out["graph_replays"] == 0
    assert [o["layers"] for o in outs] == [[0, 2]] * tp + [[2, 4]] * tp
    assert len({o["kv_slots"] for o in outs}) == 1
