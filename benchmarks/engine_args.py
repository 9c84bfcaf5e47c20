"""Engine flags for the benchmarks that start the engine in-process through the offline API:
every EngineConfig field as a flag (`--model`, `--load-format`, `--max-running-requests`...),
and the keyword arguments of the ones given."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from tessera.benchmarks.device_probe import torch_device
from tessera.benchmarks.dummy_model import resolve_dummy_model
from tessera.config import EngineConfig

_NOT_ENGINE = {"run_dir"}


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine (EngineConfig; see `tessera serve --help`)")
    EngineConfig.add_cli_args(group)  # type: ignore[arg-type]


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The EngineConfig fields set on the command line (the rest keep their defaults)."""
    out = {}
    for f in dataclasses.fields(EngineConfig):
        value = getattr(args, f.name, None)
        if value is not None and f.name not in _NOT_ENGINE:
            out[f.name] = value
    out.setdefault("model", "default")
    out["model"] = resolve_dummy_model(out["model"], out.get("load_format", "auto"))
    return out


def effective_config(kwargs: dict[str, Any]) -> EngineConfig:
    return EngineConfig(**kwargs)


def weight_dtype(config: EngineConfig, device: str) -> str:
    """The dtype the worker computes in: --dtype, else bf16 on an accelerator and fp32 on the
    cpu plugin (EngineConfig's documented 'auto')."""
    if config.dtype != "auto":
        return config.dtype
    return "float32" if device == "cpu" else "bfloat16"


def model_config(config: EngineConfig) -> Any:
    from tessera.formats import open_model

    return open_model(config.model, config.load_format, config.seed).config


def resolve_engine(args: argparse.Namespace) -> tuple[dict[str, Any], EngineConfig, str, str,
                                                      Any]:
    """What the engine flags amount to: (engine kwargs, EngineConfig, torch device name,
    weight dtype, model config)."""
    kwargs = engine_kwargs(args)
    engine = effective_config(kwargs)
    device = torch_device()
    return kwargs, engine, device, weight_dtype(engine, device), model_config(engine)


def scheduler_stats(llm: Any) -> dict[str, float]:
    """The scheduler's latest heartbeat numbers ({} if it does not answer)."""
    try:
        processes = llm.status()
    except Exception:
        return {}
    return dict(processes.get("scheduler", {}).get("stats", {}))


def settled_scheduler_stats(llm: Any, interval_s: float = 0.5, timeout_s: float = 10.0
                            ) -> dict[str, float]:
    """The scheduler's heartbeat numbers once they stop changing. Read right after the last
    answer, the latest heartbeat may predate the last steps; two reads more than a heartbeat
    (`interval_s`) apart whose work counters (`*_total`, `steps`) agree are settled; gauges
    such as the process's CPU time move with every heartbeat."""
    from tessera.bus.settle import read_settled

    def counters(stats: dict[str, float]) -> dict[str, float]:
        return {k: v for k, v in stats.items() if k.endswith("_total") or k == "steps"}

    return read_settled(lambda: scheduler_stats(llm), 1.5 * interval_s, timeout_s,
                        key=counters, ready=bool, what="the scheduler's figures")


def worker_stats(llm: Any) -> dict[str, dict[str, float]]:
    """Each worker's latest heartbeat numbers (steps, forward time, ...) by process name."""
    try:
        processes = llm.status()
    except Exception:
        return {}
    return {name: dict(info.get("stats", {})) for name, info in processes.items()
            if name.startswith("worker")}


def process_stats(llm: Any) -> dict[str, dict[str, float]]:
    """Every engine process's latest heartbeat numbers, by process name."""
    try:
        processes = llm.status()
    except Exception:
        return {}
    return {name: dict(info.get("stats", {})) for name, info in processes.items()}


def gc_pauses(before: dict[str, dict[str, float]],
              after: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Each process's garbage-collector passes between two of its heartbeats
    (`bus/gc_pauses.py`): collections of each generation and their pause in ms, total, and
    the longest in the process's life so far."""
    out = {}
    for name, stats in after.items():
        old = before.get(name, {})
        keys = [k for k in stats if k.startswith("gc_collections")]
        if not keys:
            continue
        row = {k: stats[k] - old.get(k, 0.0) for k in keys}
        row["gc_pause_ms_total"] = (stats.get("gc_pause_ms_total", 0.0)
                                    - old.get("gc_pause_ms_total", 0.0))
        row["gc_pause_ms_max"] = stats.get("gc_pause_ms_max", 0.0)
        row["gc_frozen_objects"] = stats.get("gc_frozen_objects", 0.0)
        out[name] = row
    return out


def host_path(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """A worker's host path between two of its heartbeats: milliseconds of host work to
    launch a step, and of the round trip from a result sent to the next batch in hand (the
    scheduler's turn and two bus hops) where the worker waited for it: with two steps in
    flight the device idles once the two together exceed its step."""
    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    launches, trips = delta("launches_timed"), delta("round_trips")
    return {"launch_ms_per_step": delta("launch_ms_total") / launches if launches else 0.0,
            "round_trip_ms": delta("round_trip_ms_total") / trips if trips else 0.0,
            "round_trips": trips}
