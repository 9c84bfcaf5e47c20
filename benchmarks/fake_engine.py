"""`python -m tessera.benchmarks.fake_engine [tessera serve flags] [--step-ms MS]
[--prefill-us-per-token US] [--cost-model tokens|flat [--padded]]`: `tessera serve` with the fake
worker (fake_worker.py) in place
of the model workers. Every other process is the real one: server, tokenizer, scheduler,
detokenizer, supervisor. `tessera bench host` starts it to measure the host path."""

from __future__ import annotations

import argparse
import sys

from tessera.benchmarks.fake_worker import add_device_args, device_argv
from tessera.bus.launcher import build_specs, check_config, check_port_free, run_supervised
from tessera.bus.process import setup_logging
from tessera.bus.run_paths import RunPaths
from tessera.bus.supervisor import ProcessSpec
from tessera.config import READY_TIMEOUT_S, Env, ServerConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.benchmarks.fake_engine",
                                     description=__doc__)
    ServerConfig.add_cli_args(parser)
    add_device_args(parser)
    args = parser.parse_args(argv)
    fake_args = device_argv(parser, args)
    env = Env.read()
    try:
        config = ServerConfig.from_cli(args, env)
    except (TypeError, ValueError) as exc:
        print(f"invalid configuration: {exc}", file=sys.stderr)
        return 2
    setup_logging(config.log_level, "supervisor", config.log_format)
    problem = check_config(config)
    if problem is not None or config.tp_size != 1:
        print(problem or "the fake engine has one worker: --tp-size 1", file=sys.stderr)
        return 2

    def build(config: ServerConfig, paths: RunPaths) -> list[ProcessSpec]:
        fake = ProcessSpec.python_module(
            "worker0", "tessera.benchmarks.fake_worker", paths, *fake_args, stage=0,
            ready_timeout_s=READY_TIMEOUT_S["worker"])
        return [fake, *(s for s in build_specs(config, paths) if not s.name.startswith("worker"))]

    return run_supervised(config, env, build=build,
                          preflight=lambda: check_port_free(config.host, config.port))


if __name__ == "__main__":
    sys.exit(main())
