"""Configuration: flags over environment over defaults, JSON round trip, CLI flags, and the
scheduler's config derived from the engine's."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys

import pytest

from tessera.bus.messages import WorkerReady
from tessera.config import BatchingConfig, EngineConfig, Env, ServerConfig
from tessera.scheduler_proc.config import SchedulerConfig

NO_ENV = Env(None, None, None, None, None)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    ServerConfig.add_cli_args(parser)
    return parser.parse_args(argv)


def test_flags_win_over_environment_over_defaults() -> None:
    env = Env(hal="cuda", api_key="s3cr3t-key", run_root=None, log_level="debug",
              default_model="m.gguf")
    cfg = ServerConfig.from_cli(parse(["--hal", "cpu", "--port", "31000"]), env)
    assert (cfg.hal, cfg.port, cfg.model, cfg.log_level) == ("cpu", 31000, "m.gguf", "debug")
    # The API key is read by the server from its environment: never written to config.json.
    assert "s3cr3t-key" not in cfg.to_json() and not hasattr(cfg, "api_key")
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
    cfg = ServerConfig(model="x.gguf", tp_size=2, port=1234, api_key_file="/keys")
    assert ServerConfig.from_json(cfg.to_json()) == cfg
    assert EngineConfig.from_json(cfg.to_json()).model == "x.gguf"  # server fields ignored
    with pytest.raises(AttributeError):
        cfg.port = 1  # type: ignore[misc]


def test_scheduler_switches_are_engine_flags() -> None:
    assert ServerConfig.from_cli(parse([]), NO_ENV).overlap is True
    cfg = ServerConfig.from_cli(parse(["--no-overlap", "--debug-invariants",
                                       "--step-timeout-s", "7.5"]), NO_ENV)
    assert (cfg.overlap, cfg.debug_invariants, cfg.step_timeout_s) == (False, True, 7.5)
    assert ServerConfig.from_cli(parse(["--overlap"]), NO_ENV).overlap is True


def test_invalid_batching_values_are_refused_at_configuration() -> None:
    with pytest.raises(ValueError, match="schedule_policy"):
        EngineConfig(schedule_policy="lifo")
    with pytest.raises(ValueError, match="max_running_requests"):
        EngineConfig(max_running_requests=0)
    with pytest.raises(ValueError, match="prefill_backlog_steps"):
        EngineConfig(prefill_backlog_steps=-1)
    with pytest.raises(ValueError, match="max_backlog_step_ratio"):
        EngineConfig(max_backlog_step_ratio=1.0)
    cfg = ServerConfig.from_cli(parse(["--prefill-backlog-steps", "0",
                                       "--max-backlog-step-ratio", "3"]), NO_ENV)
    assert (cfg.prefill_backlog_steps, cfg.max_backlog_step_ratio) == (0, 3.0)


def test_scheduler_config_takes_every_batching_field_from_the_engine() -> None:
    engine = EngineConfig(page_size=8, max_running_requests=3, chunked_prefill_size=64,
                          max_queued_requests=9, disable_radix_cache=True,
                          schedule_policy="priority", overlap=False, debug_invariants=True)
    ready = WorkerReady(rank=0, world_size=1, num_slots=800, page_size=8, max_context_len=256,
                        vocab_size=100, eos_token_ids=[2, 7], step_token_sizes=[64, 32])
    sc = SchedulerConfig.from_engine(engine, ready)
    assert sc.step_token_sizes == (32, 64)  # ascending, as fill_padding walks them
    for f in dataclasses.fields(BatchingConfig):
        if f.name != "overlap_steps":  # auto (0) is the workers' to resolve: below
            assert getattr(sc, f.name) == getattr(engine, f.name), f.name
    assert (sc.num_slots, sc.max_context_len, sc.eos_token_ids, sc.vocab_size) == \
        (800, 256, (2, 7), 100)
    with pytest.raises(ValueError, match="page_size"):
        SchedulerConfig.from_engine(engine.replace(page_size=16), ready)
    # Its defaults are the engine's: nothing repeated.
    default = SchedulerConfig(num_slots=64, max_context_len=32)
    for f in dataclasses.fields(BatchingConfig):
        assert getattr(default, f.name) == getattr(EngineConfig(), f.name), f.name


def test_auto_overlap_steps_is_the_plugins_unless_something_assumes_two() -> None:
    """--overlap-steps 0 (the default) takes the plugin's Capabilities.overlap_steps, which the
    workers report in WorkerReady; a value given stays; speculative decoding and pipeline
    stages (which assume 2) get 2; a WorkerReady that says nothing counts as 2."""
    from tessera.hal.cpu import CpuPlatform

    assert EngineConfig().overlap_steps == 0
    assert EngineConfig().overlap_steps_with(3) == 3
    assert EngineConfig(overlap_steps=4).overlap_steps_with(3) == 4
    assert EngineConfig(overlap_steps=2).overlap_steps_with(3) == 2
    assert EngineConfig(speculative_algorithm="ngram").overlap_steps_with(3) == 2
    assert EngineConfig(pp_size=2).overlap_steps_with(3) == 2  # pipeline stages
    assert CpuPlatform.capabilities.overlap_steps == 2
    engine = EngineConfig(page_size=8)
    assert engine.steps_in_flight_with(3) == 3 and engine.steps_in_flight_with(2) == 2
    assert engine.replace(overlap=False).steps_in_flight_with(3) == 1
    assert engine.replace(overlap_steps=2).steps_in_flight_with(3) == 2

    def ready(steps: int) -> WorkerReady:
        return WorkerReady(rank=0, world_size=1, num_slots=800, page_size=8,
                           max_context_len=256, vocab_size=100, overlap_steps=steps)

    assert SchedulerConfig.from_engine(engine, ready(3)).steps_in_flight == 3
    assert SchedulerConfig.from_engine(engine, ready(0)).steps_in_flight == 2
    explicit = engine.replace(overlap_steps=4)
    assert SchedulerConfig.from_engine(explicit, ready(3)).steps_in_flight == 4
    with pytest.raises(ValueError, match="or 0"):
        EngineConfig(overlap_steps=1)


def test_importing_the_config_loads_nothing_else_of_tessera() -> None:
    code = ("import sys, tessera.config; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tessera', 'torch', 'zmq', 'numpy', 'msgpack')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "['tessera', 'tessera.config']"


def test_graph_flags_keep_the_names_other_engines_use() -> None:
    cfg = ServerConfig.from_cli(parse(["--disable-cuda-graph", "--cuda-graph-max-bs", "32"]),
                                NO_ENV)
    assert cfg.disable_graph_capture and cfg.graph_max_bs == 32
    cfg = ServerConfig.from_cli(parse(["--graph-max-bs", "8"]), NO_ENV)
    assert cfg.graph_max_bs == 8 and not cfg.disable_graph_capture


def test_allowed_special_tokens_flag_is_a_set() -> None:
    config = ServerConfig.from_cli(
        parse(["--allowed-special-tokens", "<|im_end|>, <|im_start|>"]), NO_ENV)
    assert config.allowed_special == frozenset({"<|im_end|>", "<|im_start|>"})
    assert ServerConfig.from_cli(parse([]), NO_ENV).allowed_special == frozenset()


def test_pipeline_batches_default_to_one_more_than_the_stages() -> None:
    assert EngineConfig(pp_size=1).pipeline_batches == 0  # one stage: steps are chained
    assert EngineConfig(pp_size=2).pipeline_batches == 3
    assert EngineConfig(pp_size=4, pp_batches_in_flight=4).pipeline_batches == 4
