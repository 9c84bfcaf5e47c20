"""Configuration: flags over environment over defaults, JSON round trip, CLI flags."""

from __future__ import annotations

import argparse

import pytest

from tessera.bus.config import EngineConfig, Env, RunPaths, ServerConfig


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    ServerConfig.add_cli_args(parser)
    return parser.parse_args(argv)


def test_flags_win_over_environment_over_defaults() -> None:
    env = Env(hal="cuda", api_key="k", run_root=None, log_level="debug", default_model="m.gguf")
    cfg = ServerConfig.from_cli(parse(["--hal", "cpu", "--port", "31000"]), env)
    assert (cfg.hal, cfg.port, cfg.model, cfg.api_key, cfg.log_level) == \
        ("cpu", 31000, "m.gguf", "k", "debug")
    assert ServerConfig.from_cli(parse([]), Env(None, None, None, None, None)) == ServerConfig()


def test_environment_is_read_from_tessera_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESSERA_HAL", "cpu")
    monkeypatch.setenv("TESSERA_RUN_ROOT", "/somewhere")
    monkeypatch.delenv("TESSERA_API_KEY", raising=False)
    env = Env.read()
    assert env.hal == "cpu" and env.run_root == "/somewhere" and env.api_key is None


def test_every_field_is_a_flag_and_types_parse() -> None:
    args = parse(["--tp-size", "2", "--mem-fraction", "0.5", "--disable-radix-cache",
                  "--served-model-name", "smol", "--max-total-tokens", "4096"])
    cfg = ServerConfig.from_cli(args, Env(None, None, None, None, None))
    assert cfg.tp_size == 2 and cfg.mem_fraction == 0.5 and cfg.disable_radix_cache
    assert cfg.served_model_name == "smol" and cfg.max_total_tokens == 4096
    with pytest.raises(SystemExit):
        parse(["--load-format", "pickle"])


def test_json_round_trip_and_frozen() -> None:
    cfg = ServerConfig(model="x.gguf", tp_size=2, port=1234, api_key="s")
    assert ServerConfig.from_json(cfg.to_json()) == cfg
    assert EngineConfig.from_json(cfg.to_json()).model == "x.gguf"  # server fields ignored
    with pytest.raises(AttributeError):
        cfg.port = 1  # type: ignore[misc]


def test_run_paths_names(run_root) -> None:  # type: ignore[no-untyped-def]
    paths = RunPaths.create()
    assert paths.run_dir.startswith(str(run_root))
    assert paths.shm_req_to_token == paths.shm_name("req_to_token")
    assert paths.shm_name("").startswith("tessera_") and paths.run_id in paths.shm_name("")
    assert paths.client_endpoint() != paths.client_endpoint()
