"""`tessera serve`: set up a run directory, start every engine process under the supervisor,
print where the server answers, and clean everything up on the way out.

The process list is data (`build_specs`): the workers (one per TP rank), scheduler,
detokenizer and tokenizers start together; then the HTTP server, which runs a warm-up request
before it reports ready.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shlex
import socket
import sys
import tempfile
import time
from collections.abc import Callable

from tessera.bus.cleanup import remove_run, remove_stale_runs
from tessera.bus.process import setup_logging
from tessera.bus.replicas import check_replicas, run_replicas
from tessera.bus.restarts import RestartPolicy
from tessera.bus.run_paths import RunPaths
from tessera.bus.supervisor import Child, ProcessSpec, Supervisor
from tessera.codes import MODEL_NOT_FOUND, PORT_IN_USE, coded
from tessera.config import READY_TIMEOUT_S, EngineConfig, Env, ServerConfig
from tessera.manifest import RunManifest, now_iso, platform_sections, runs_dir
from tessera.version import version_line

log = logging.getLogger(__name__)

MAX_IPC_PATH = 107  # sun_path of a Unix socket address on Linux, less the final NUL
CORE_GROUP = "core"  # the processes restarted together


def restart_policy(config: EngineConfig) -> RestartPolicy | None:
    # Several hosts: a restarted rank could not rejoin the other nodes' collectives, so any
    # death stops the node (and through the link, the others).
    if config.restart_policy == "off" or config.nnodes > 1:
        return None
    return RestartPolicy(max_restarts=config.restart_max, window_s=config.restart_window_s,
                         backoff_s=config.restart_backoff_s)


def build_specs(config: ServerConfig, paths: RunPaths) -> list[ProcessSpec]:
    """The engine's processes in start order (see the module docstring)."""
    plan: list[tuple[str, str, list[str], int, bool]] = []  # name, module, args, stage, drains
    # Stage 0 starts every engine process at once: the light ones (interpreter, imports,
    # vocabulary) start while the workers load the model instead of after it, and the
    # scheduler waits for the workers' WorkerReady itself. The server comes last: its
    # warm-up generation needs the whole engine.
    # One worker per (pipeline stage, tensor-parallel rank): rank = stage * tp_size + tp_rank.
    # With --nnodes N this node runs its block of ranks, and the link to the other nodes
    # (bus/node_link.py); a node other than 0 runs nothing else, its workers once it joined.
    remote = config.node_rank > 0
    if config.nnodes > 1:
        plan.append(("link", "tessera.bus.node_link", [], 0, False))
    plan += [(f"worker{r}", "tessera.worker_proc", ["--rank", str(r)], 1 if remote else 0,
              False) for r in config.local_ranks]
    if remote:
        return _specs(plan, paths)
    plan.append(("scheduler", "tessera.scheduler_proc", [], 0, False))
    plan.append(("detokenizer", "tessera.detokenizer_proc", [], 0, False))
    plan += [(f"tokenizer{i}", "tessera.tokenizer_proc", ["--index", str(i)], 0, False)
             for i in range(config.tokenizer_workers)]
    plan.append(("server", "tessera.server", [], 1, True))
    return _specs(plan, paths)


def _specs(plan: list[tuple[str, str, list[str], int, bool]],
           paths: RunPaths) -> list[ProcessSpec]:
    specs: list[ProcessSpec] = []
    for name, module, args, stage, drains in plan:
        kind = name.rstrip("0123456789")
        # The worker ranks and the scheduler restart together: a new scheduler writes a new
        # page table, and the workers' KV arena means nothing without the old one.
        group = CORE_GROUP if kind in ("worker", "scheduler") else ""
        stale = (paths.tp_rendezvous,) if kind == "worker" else ()
        # The scheduler is ready only after the workers: its time includes theirs.
        timeout = READY_TIMEOUT_S[kind] + (READY_TIMEOUT_S["worker"] if kind == "scheduler"
                                           else 0.0)
        specs.append(ProcessSpec.python_module(name, module, paths, *args, stage=stage,
                                               ready_timeout_s=timeout,
                                               drains=drains, group=group, stale_files=stale))
    return specs


def check_port_free(host: str, port: int) -> str | None:
    """A message if the HTTP port cannot be bound, so we fail before loading a model."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return (f"cannot listen on {host}:{port} ({exc.strerror}); stop what uses it or "
                    f"choose another port with --port" + coded(PORT_IN_USE))
    return None


def check_config(config: ServerConfig) -> str | None:
    if config.tp_size < 1:
        return f"--tp-size must be at least 1, got {config.tp_size}"
    if config.pp_size < 1:
        return f"--pp-size must be at least 1, got {config.pp_size}"
    if config.ep_size < 1 or config.tp_size % config.ep_size:
        return f"--ep-size {config.ep_size} must divide --tp-size {config.tp_size}"
    if config.tokenizer_workers < 1:
        return f"--tokenizer-workers must be at least 1, got {config.tokenizer_workers}"
    if not 0 <= config.port <= 65535:
        return f"--port must be in [0, 65535], got {config.port}"
    if config.api_key_file and not os.access(config.api_key_file, os.R_OK):
        return f"--api-key-file {config.api_key_file} cannot be read"
    if config.restart_max < 1 or config.restart_backoff_s < 0 or config.restart_window_s <= 0:
        return (f"--restart-max must be at least 1 and --restart-backoff-s, "
                f"--restart-window-s not negative (got {config.restart_max}, "
                f"{config.restart_backoff_s}, {config.restart_window_s})")
    problem = check_replicas(config) or check_nodes(config)
    if problem:
        return problem
    if config.heartbeat_timeout_s <= config.heartbeat_interval_s:
        return (f"--heartbeat-timeout-s ({config.heartbeat_timeout_s}) must exceed "
                f"--heartbeat-interval-s ({config.heartbeat_interval_s})")
    return check_model_files(config)


def check_nodes(config: ServerConfig) -> str | None:
    if config.nnodes < 1 or not 0 <= config.node_rank < config.nnodes:
        return (f"--node-rank must be in [0, --nnodes) and --nnodes at least 1 (got "
                f"{config.node_rank} of {config.nnodes})")
    if config.nnodes == 1:
        return None
    from tessera.bus.node_link import split_addr

    if not config.dist_init_addr:
        return "--nnodes > 1 needs --dist-init-addr HOST:PORT of node 0"
    try:
        split_addr(config.dist_init_addr)
    except ValueError as exc:
        return str(exc)
    if config.world_size % config.nnodes:
        return (f"--nnodes {config.nnodes} must divide the worker ranks (--tp-size x "
                f"--pp-size = {config.world_size})")
    import zmq

    if not zmq.has("curve"):
        return "--nnodes > 1 needs ZeroMQ with CURVE (libsodium) for the encrypted bus link"
    return None


def default_key_file(env: Env) -> str:
    """Beside the run manifests: ~/.local/state/tessera/bus-key.json."""
    return os.path.join(os.path.dirname(runs_dir(env.runs_dir)), "bus-key.json")


def prepare_node_keys(config: ServerConfig, env: Env) -> tuple[ServerConfig, str | None]:
    """Several hosts: the key file of the encrypted link, written on node 0 if missing and
    required elsewhere. (config with the path set, a message when it cannot be used)."""
    if config.nnodes == 1:
        return config, None
    from tessera.bus.curve import KeyFileError, ensure_keys, read_keys

    path = config.dist_key_file or default_key_file(env)
    config = config.replace(dist_key_file=os.path.abspath(path))
    try:
        if config.node_rank == 0:
            existed = os.path.exists(path)
            ensure_keys(path)
            if not existed:
                log.info("wrote the bus key pair to %s (mode 0600): copy it to the other "
                         "nodes and give it to them with --dist-key-file", path)
        else:
            read_keys(path)
    except (KeyFileError, OSError) as exc:
        return config, str(exc)
    return config, None


def check_model_files(config: EngineConfig) -> str | None:
    """One line saying what is wrong with --model (or --speculative-draft-model), before any
    process is started."""
    from tessera.formats.check import check_model
    from tessera.formats.errors import ModelFormatError

    try:
        check_model(config.model, config.load_format)
    except ModelFormatError as exc:
        return f"{exc}" + coded(MODEL_NOT_FOUND)
    if config.speculative_draft_model:
        try:
            check_model(config.speculative_draft_model, config.load_format)
        except ModelFormatError as exc:
            return f"--speculative-draft-model: {exc}" + coded(MODEL_NOT_FOUND)
    return None


def check_split(config: EngineConfig) -> str | None:
    """An impossible --tp-size / --pp-size / --ep-size for the model, said before anything
    starts. A model that cannot be opened here is left to the workers, which say why."""
    from tessera.formats import open_model
    from tessera.formats.parallel import split_problems

    try:
        model = open_model(config.model, config.load_format, config.seed).config
    except Exception as exc:  # noqa: BLE001 - the workers report it with their context
        log.debug("split check skipped: %s", exc)
        return None
    problems = split_problems(model, config.tp_size, config.pp_size, config.ep_size)
    return "; ".join(problems) if problems else None


def ready_banner(config: ServerConfig, children: list[Child], startup: str = "") -> str:
    """The URL and a curl line to paste, printed once every process is ready."""
    host = "127.0.0.1" if config.host in ("0.0.0.0", "::", "") else config.host
    url = f"http://{host}:{config.port}"
    # The server reports the model id it serves; it comes last, so look from the end.
    model = next((str(c.info["model"]) for c in reversed(children) if c.info.get("model")),
                 None) or config.served_model_name or "default"
    body = json.dumps({"model": model, "max_tokens": 32,
                       "messages": [{"role": "user", "content": "Say hello."}]})
    keyed = config.api_key_file or Env.read().api_key
    auth = " -H \"Authorization: Bearer $KEY\"" if keyed else ""
    return (f"\ntessera is ready at {url}  (model: {model}; stop with Ctrl-C)\n"
            + (f"  {startup}\n" if startup else "") +
            f"  curl {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} "
            f"-d {shlex.quote(body)}\n")


def node_banner(config: ServerConfig) -> str:
    from tessera.bus.node_link import link_endpoint

    ranks = list(config.local_ranks)
    return (f"\ntessera node {config.node_rank} of {config.nnodes} is ready: worker ranks "
            f"{ranks}, joined node 0 at {link_endpoint(config.dist_init_addr or '')}; stop "
            f"with Ctrl-C (node 0 stops with it)\n")


def key_on_command_line(argv: list[str]) -> bool:
    return any(a == "--api-key" or a.startswith("--api-key=") for a in argv)


def main(argv: list[str] | None = None) -> int:
    launched_at = time.time()
    argv = list(sys.argv[1:] if argv is None else argv)
    if key_on_command_line(argv):
        print("tessera serve: an API key on the command line is visible to every user of the "
              "machine (ps); put it in a file given with --api-key-file (mode 0600), or in "
              "TESSERA_API_KEY", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(
        prog="tessera serve",
        description="Start and supervise every tessera process and serve the OpenAI API over "
                    "HTTP. Flags override TESSERA_* environment variables.")
    parser.add_argument("--version", action="version", version=version_line())
    ServerConfig.add_cli_args(parser)
    args = parser.parse_args(argv)
    env = Env.read()
    try:
        config = ServerConfig.from_cli(args, env)
    except (TypeError, ValueError) as exc:
        print(f"tessera serve: invalid configuration: {exc}", file=sys.stderr)
        return 2
    setup_logging(config.log_level, "supervisor", config.log_format)
    problem = check_config(config) or check_split(config)
    if problem:
        print(f"tessera serve: {problem}", file=sys.stderr)
        return 2
    config, problem = prepare_node_keys(config, env)
    if problem:
        print(f"tessera serve: {problem}", file=sys.stderr)
        return 2
    if config.node_rank > 0:
        return run_supervised(config, env, launched_at=launched_at, argv=argv,
                              on_ready=lambda _children: print(node_banner(config), flush=True))
    if config.dp_size > 1:
        metrics_port = (config.replica_metrics_port if config.replica_metrics_port is not None
                        else config.port + 1)
        problem = (check_port_free(config.host, config.port)
                   or check_port_free(config.host, metrics_port))
        if problem:
            print(f"tessera serve: {problem}", file=sys.stderr)
            return 2
        return run_replicas(config, argv)
    return run_supervised(config, env,
                          preflight=lambda: check_port_free(config.host, config.port),
                          launched_at=launched_at, argv=argv)


def run_supervised(config: ServerConfig, env: Env,
                   build: Callable[[ServerConfig, RunPaths], list[ProcessSpec]] = build_specs,
                   on_ready: Callable[[list[Child]], None] | None = None,
                   preflight: Callable[[], str | None] | None = None,
                   launched_at: float | None = None, kind: str = "serve",
                   argv: list[str] | None = None) -> int:
    """Clean up crashed runs, create this run's directory, supervise `build`'s processes,
    and remove the directory and this run's shared memory whatever happens.

    `preflight` runs after the clean-up (an orphan of a crashed run may have held the port)
    and before anything starts; a message from it ends the run with exit code 2.
    The run's manifest (tessera/manifest.py) is written at the start, at ready and at the end.
    """
    remove_stale_runs(env.run_root or tempfile.gettempdir())
    problem = preflight() if preflight is not None else None
    if problem:
        log.error("%s", problem)
        return 2
    own_dir = config.run_dir is None or not os.path.exists(config.run_dir)
    paths = RunPaths.create(config.run_dir, env)
    try:
        # The longest endpoint is a client's reply socket (+8: a longer pid than ours).
        longest = len(paths.client_endpoint().removeprefix("ipc://")) + 8
        if longest > MAX_IPC_PATH:
            log.error("the run directory %s is too long for ipc sockets (%d of %d bytes); set "
                      "TESSERA_RUN_ROOT or --run-dir to a shorter folder", paths.run_dir,
                      longest, MAX_IPC_PATH)
            return 2
        config = config.replace(run_dir=paths.run_dir)
        with open(paths.config_file, "w") as f:
            f.write(config.to_json())
        with open(paths.pid_file, "w") as f:
            f.write(f"{os.getpid()}\n")
        specs = build(config, paths)
        if not specs:
            log.error("no engine process exists in this checkout; nothing to serve")
            return 2
        log.info("run directory %s", paths.run_dir)
        manifest = RunManifest(kind, dataclasses.asdict(config), argv=argv or sys.argv[1:],
                               model=config.model, load_format=config.load_format,
                               run_dir=paths.run_dir, runs_folder=runs_dir(env.runs_dir),
                               keep=config.runs_keep, run_id=paths.run_id)
        manifest.write()

        def banner(children: list[Child]) -> None:
            startup = supervisor.startup.line() if supervisor.startup else ""
            print(ready_banner(config, children, startup), flush=True)

        def ready(children: list[Child]) -> None:
            hal, devices = platform_sections((c.spec.name, c.info) for c in children)
            startup = supervisor.startup.to_dict() if supervisor.startup else {}
            manifest.update(hal=hal, devices=devices,
                            run={"outcome": "ready", "startup": startup})
            manifest.hash_missing()  # in the background: start-up does not wait for it
            (on_ready or banner)(children)

        supervisor = Supervisor(paths, specs, heartbeat_timeout_s=config.heartbeat_timeout_s,
                                drain_timeout_s=config.drain_timeout_s, on_ready=ready,
                                restart=restart_policy(config), launched_at=launched_at)
        code = supervisor.run()
        manifest.update(run={"outcome": f"exit {code}", "failure": supervisor.failure,
                             "ended": now_iso()})
        return code
    finally:
        segments = remove_run(paths, keep_dir=not own_dir)
        if segments:
            log.info("removed shared memory left by children: %s", ", ".join(segments))


if __name__ == "__main__":
    sys.exit(main())
