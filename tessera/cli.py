"""The `tessera` command: subcommands are looked up here and imported only when run."""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module, function, one-line help). Each function takes argv (list[str])
# and returns an exit code.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "serve": ("tessera.bus.launcher", "main", "start and supervise every process, serve HTTP"),
    "doctor": ("tessera.doctor", "main", "pre-flight check of plugins, devices, versions, "
               "models"),
    "hash": ("tessera.formats.integrity", "main",
             "write a SHA-256 manifest of a model's files (for serve --verify-weights)"),
    "bench": ("tessera.benchmarks.cli", "main", "run a benchmark (serving, offline, latency, ...)"),
    "manifest": ("tessera.manifest_cli", "main",
                 "list recorded runs, show one, or diff two (what changed between them)"),
}


def usage() -> str:
    lines = ["usage: tessera [--version] COMMAND [args]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from tessera.version import version_line

        print(version_line())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"tessera: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module, func, _ = COMMANDS[name]
    return int(getattr(importlib.import_module(module), func)(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
