"""Run manifests: two real `tessera serve` runs with different flags, whose manifests' diff
names exactly the flag that changed; the pieces (hash cache, pruning, diff, run references)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tessera.manifest import HashCache, RunManifest
from tessera.manifest_cli import diff, find_manifest, main

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 1024,
        "eos_token_id": 2}


def manifest_cli(*args: str, runs: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tessera", "manifest", "--runs-dir", str(runs),
                           *args], capture_output=True, text=True, timeout=60)


@pytest.mark.integration
def test_two_serve_runs_differ_exactly_in_the_changed_flag(tmp_path: Path, run_root: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    from tessera.benchmarks.server_launch import ServerProcess, free_port

    runs = tmp_path / "runs"
    monkeypatch.setenv("TESSERA_RUNS_DIR", str(runs))
    model = tmp_path / "tiny.json"
    model.write_text(json.dumps(TINY))
    base = ["--model", str(model), "--load-format", "dummy", "--hal", "cpu",
            "--max-total-tokens", "1024", "--heartbeat-interval-s", "0.2"]
    port = free_port()  # the same for both: a different port would be a difference too
    for extra in (["--max-running-requests", "8"], ["--max-running-requests", "16"]):
        with ServerProcess([*base, *extra], port=port,
                           log_path=str(tmp_path / "serve.log")) as server:
            server.wait_ready(180)
            # The launcher writes the ready sections (hal, devices, start-up) once it has
            # every process's Ready, which may come just after the HTTP port answers.
            deadline = time.monotonic() + 60
            while True:
                current = json.loads(Path(find_manifest("-1", str(runs))).read_text())
                if current["run"].get("outcome") == "ready" or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert current["run"].get("outcome") == "ready", current["run"]
            run_dir = current["run"]["run_dir"]
            assert os.path.isfile(os.path.join(run_dir, "manifest.json"))  # in the run dir too
    first = json.loads(Path(find_manifest("-2", str(runs))).read_text())
    second = json.loads(Path(find_manifest("-1", str(runs))).read_text())
    for m in (first, second):
        assert m["kind"] == "serve" and m["run"]["outcome"] == "exit 0"
        assert m["arguments"]["page_size"] == 16  # defaults are recorded too
        assert m["model"]["files"]["tiny.json"]["sha256"]  # hashed after start-up
        assert m["hal"]["name"] == "cpu" and m["hal"]["files_sha256"]
        assert m["devices"]["count"] == 1 and m["devices"]["names"]
        assert m["versions"]["torch"] and m["versions"]["tessera"]
        assert m["run"]["startup"]["ready_s"] > 0
    out = manifest_cli("diff", "-2", "-1", runs=runs)
    assert out.returncode == 1
    assert out.stdout.splitlines() == ["arguments.max_running_requests: 8 -> 16"], out.stdout
    listed = manifest_cli("list", runs=runs).stdout.splitlines()
    assert len(listed) == 2 and all("serve" in line for line in listed)


def test_diff_names_added_removed_and_changed_keys() -> None:
    a = {"id": "1", "arguments": {"x": 1, "y": [1, 2]}, "run": {"pid": 1}, "hal": {"v": "a"}}
    b = {"id": "2", "arguments": {"x": 2, "y": [1, 2], "z": True}, "run": {"pid": 2},
         "hal": {}}
    assert diff(a, b) == [("arguments.x", 1, 2), ("arguments.z", "<absent>", True),
                          ("hal", "<absent>", {}), ("hal.v", "a", "<absent>")]
    assert ("run.pid", 1, 2) in diff(a, b, include_run=True)
    assert diff(a, a) == []


def test_manifests_are_kept_up_to_n_and_hashes_are_cached(tmp_path: Path) -> None:
    model = tmp_path / "m.json"
    model.write_text(json.dumps(TINY))
    runs = tmp_path / "runs"
    for i in range(4):
        m = RunManifest("serve", {"seed": i}, model=str(model), load_format="dummy",
                        runs_folder=str(runs), keep=3, run_id=str(i))
        m.write()
        m.hash_missing(background=False)
    assert len([d for d in os.listdir(runs) if (runs / d / "manifest.json").is_file()]) == 3
    cache = HashCache(str(runs / "hashes.json"))
    assert cache.lookup(str(model)) is not None
    model.write_text(json.dumps({**TINY, "vocab_size": 1024}))  # changed: hashed again
    assert cache.lookup(str(model)) is None
    assert main(["--runs-dir", str(runs), "diff", "-3", "-1"]) == 1
    with pytest.raises(SystemExit, match="only 3 run"):
        find_manifest("-9", str(runs))
