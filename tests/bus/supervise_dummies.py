"""Run the real `tessera serve` machinery (launcher.run_supervised: stale cleanup, run
directory, supervisor, clean-up) over dummy children; the supervisor tests start this as a
real process so that they can signal it and read its exit code.

    python supervise_dummies.py '{"heartbeat_timeout_s": 2, "procs": [[name, stage, [args]]]}'

Without "restart_policy": "on" in the plan, any failure stops everything (restart policy off);
"groups": {name: group} puts processes in one restart group.

Prints "READY <run_dir>" on stdout once every child is ready.
"""

from __future__ import annotations

import json
import os
import sys

from tessera.bus.launcher import run_supervised
from tessera.bus.process import setup_logging
from tessera.bus.run_paths import RunPaths
from tessera.bus.supervisor import Child, ProcessSpec
from tessera.config import Env, ServerConfig

DUMMY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dummy_proc.py")


def main(plan_json: str) -> int:
    plan = json.loads(plan_json)
    # A generous default: on a busy machine a dummy may not run for seconds, and only the
    # tests of hang detection want it short (they say so).
    config = ServerConfig(heartbeat_interval_s=0.1,
                          heartbeat_timeout_s=plan.get("heartbeat_timeout_s", 10.0),
                          loop_stall_timeout_s=plan.get("heartbeat_timeout_s", 10.0),
                          drain_timeout_s=plan.get("drain_timeout_s", 2.0),
                          restart_policy=plan.get("restart_policy", "off"),
                          restart_max=plan.get("restart_max", 5),
                          restart_window_s=plan.get("restart_window_s", 300.0),
                          restart_backoff_s=plan.get("restart_backoff_s", 0.2))
    setup_logging("info", "supervisor")

    def build(config: ServerConfig, paths: RunPaths) -> list[ProcessSpec]:
        return [ProcessSpec(name, (sys.executable, DUMMY, "--run-dir", paths.run_dir,
                                   "--name", name, *args), stage=stage,
                            ready_timeout_s=plan.get("ready_timeout_s", 30.0),
                            drains=name.startswith("server"),
                            group=plan.get("groups", {}).get(name, ""))
                for name, stage, args in plan["procs"]]

    def on_ready(children: list[Child]) -> None:
        print(f"READY {children[0].spec.argv[3]}", flush=True)  # argv: python dummy --run-dir D

    return run_supervised(config, Env.read(), build=build, on_ready=on_ready)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
