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


def run_workers(model_dir: str, tmp_path, tp: int, pp: int, batch: list[list[int]]) -> list:
    init = f"file://{tmp_path / f'rendezvous-{tp}x{pp}'}"
    world = tp * pp
    outs = [tmp_path / f"out-{tp}x{pp}-{r}.json" for r in range(world)]
    procs = [subprocess.Popen([sys.executable, "-m", "tests.worker_proc.pp_rank", model_dir,
                               str(r), str(tp), str(pp), init, str(outs[r]), json.dumps(batch)],
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


@pytest.mark.parametrize("kind,tp", [("llama31", 1), ("qwen2", 1), ("llama31", 2)])
def test_pipeline_stages_match_transformers(tmp_path, kind: str, tp: int) -> None:
    """qwen2 ties its embeddings: the last stage holds its own copy of the table as head."""
    model = tiny_hf_model(kind, str(tmp_path / "model"), num_hidden_layers=4)
    batch = prompts(256, [5, 17, 30])
    outs = run_workers(str(tmp_path / "model"), tmp_path, tp, 2, batch)
    want = [hf_greedy(model, p, 12) for p in batch]
    for out in outs:
        assert out["greedy"] == want
    assert [o["layers"] for o in outs] == [[0, 2]] * tp + [[2, 4]] * tp
    assert len({o["kv_slots"] for o in outs}) == 1
