"""What a new user types: `--help` shows defaults, `--version`, the flag names SGLang and vLLM
users bring, and a wrong model path answered in one line (exit 2) before any process starts."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.config import Env, ServerConfig

NO_ENV = Env(None, None, None, None, None)
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 1024}


def parse(argv: list[str]) -> ServerConfig:
    parser = argparse.ArgumentParser()
    ServerConfig.add_cli_args(parser)
    return ServerConfig.from_cli(parser.parse_args(argv), NO_ENV)


def serve(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tessera", "serve", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_aliases_of_sglang_and_vllm_set_the_same_fields() -> None:
    cfg = parse(["--model-path", "m.gguf", "--mem-fraction-static", "0.5", "--max-model-len",
                 "4096", "--served-model-name", "mine", "--tensor-parallel-size", "2",
                 "--max-num-seqs", "7", "--enforce-eager"])
    assert (cfg.model, cfg.mem_fraction, cfg.context_length, cfg.served_model_name,
            cfg.tp_size, cfg.max_running_requests, cfg.disable_graph_capture) == \
        ("m.gguf", 0.5, 4096, "mine", 2, 7, True)
    assert parse(["--gpu-memory-utilization", "0.7"]).mem_fraction == 0.7
    assert parse([]) == ServerConfig()


def test_help_shows_every_default() -> None:
    parser = argparse.ArgumentParser()
    ServerConfig.add_cli_args(parser)
    actions = [a for a in parser._actions if a.dest not in ("help",)]
    assert actions and all("(default: " in (a.help or "") for a in actions)
    text = parser.format_help()
    for shown in ("(default: 0.85)", "(default: default)", "(default: none)",
                  "(default: on)", "(default: text)"):
        assert shown in " ".join(text.split())


def test_version_of_tessera_and_of_serve() -> None:
    from tessera import __version__

    for argv in (["--version"], ["serve", "--version"]):
        out = subprocess.run([sys.executable, "-m", "tessera", *argv], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.startswith(f"tessera {__version__}"), out


@pytest.mark.parametrize("case", ["missing", "folder_without_config", "json_without_dummy",
                                  "not_gguf", "folder_without_weights"])
def test_a_bad_model_is_one_line_and_exit_2(case: str, tmp_path: Path, run_root: Path) -> None:
    (tmp_path / "tiny.json").write_text(json.dumps(TINY))
    (tmp_path / "fake.gguf").write_bytes(b"<html>not a model</html>")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(TINY))
    model = {"missing": str(tmp_path / "nope"), "folder_without_config": str(tmp_path),
             "json_without_dummy": str(tmp_path / "tiny.json"),
             "not_gguf": str(tmp_path / "fake.gguf"),
             "folder_without_weights": str(tmp_path / "hf")}[case]
    out = serve("--model", model, "--port", "0")
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "T101" in lines[0] and "Traceback" not in out.stderr, out.stderr
    assert not list(run_root.iterdir())  # no run directory: nothing was started


def test_a_bad_draft_model_is_one_line_and_exit_2(tmp_path: Path, run_root: Path) -> None:
    (tmp_path / "tiny.json").write_text(json.dumps(TINY))
    out = serve("--model", str(tmp_path / "tiny.json"), "--load-format", "dummy",
                "--speculative-algorithm", "draft", "--speculative-draft-model",
                str(tmp_path / "no-draft.json"), "--port", "0")
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--speculative-draft-model" in lines[0], out.stderr
    assert "T101" in lines[0] and "Traceback" not in out.stderr
    assert not list(run_root.iterdir())


def test_a_good_dummy_config_passes_the_check(tmp_path: Path) -> None:
    from tessera.formats.check import check_model

    (tmp_path / "tiny.json").write_text(json.dumps(TINY))
    assert check_model(str(tmp_path / "tiny.json"), "dummy") == str(tmp_path / "tiny.json")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(TINY))
    assert check_model(str(tmp_path / "hf"), "dummy") == str(tmp_path / "hf")
