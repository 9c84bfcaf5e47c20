"""`python -m tessera.bus.gateway [sglang-router flags]`: the SGLang Model Gateway (the Rust
router of the `sglang-router` package) in front of tessera replicas.

Started by `tessera serve --dp-size N` (bus/replicas.py). Only the router's compiled core and
its argument parser are imported, not its Python launcher, so that the `sglang-router` wheel
is the whole dependency (the launcher also pulls in a Python load balancer for debugging and
its web stack). The process ends with its parent: the kernel sends it SIGTERM when the
replica supervisor dies, whatever the way.
"""

from __future__ import annotations

import argparse
import sys

from tessera.bus.parent_death import end_with_parent
from tessera.codes import REPLICAS, coded

INSTALL_HINT = ("--dp-size needs the SGLang Model Gateway: pip install 'tessera[router]' "
                "(or the sglang-router wheel alone, with --no-deps)" + coded(REPLICAS))


def gateway_available() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("sglang_router.sglang_router_rs") is not None
    except ImportError:
        return False


def main(argv: list[str] | None = None) -> int:
    end_with_parent()
    try:
        from sglang_router.router import Router
        from sglang_router.router_args import RouterArgs
    except ImportError as exc:
        print(f"tessera gateway: {INSTALL_HINT} ({exc})", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog="python -m tessera.bus.gateway")
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    args = RouterArgs.from_cli_args(parser.parse_args(argv), use_router_prefix=False)
    args._validate_router_args()  # what its own launcher checks before starting
    Router.from_args(args).start()  # serves until SIGTERM / SIGINT
    return 0


if __name__ == "__main__":
    sys.exit(main())
