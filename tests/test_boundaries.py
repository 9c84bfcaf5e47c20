"""The walls of the architecture contract, asserted: what each package may import and name.

    tessera/config.py   imports nothing of tessera (tests/test_config.py checks it at runtime)
    hal/                never imports the bus or a process package
    worker_proc/        names no chip, tests no device type, probes no plugin attribute:
                        the Platform contract only
    scheduler_proc/     its parts (planner, running set, invariant) never import the Scheduler
    every package       but hal/: no chip API (torch.cuda, triton, device-type tests)
    scheduler, bus, server, tokenizer, detokenizer, client: import no torch
    a process package   never imports another process package
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROCESS_PACKAGES = ("scheduler_proc", "worker_proc", "tokenizer_proc", "detokenizer_proc",
                    "server")
# benchmarks/ is left out: it times transformers as a peer on a named chip.
NON_HAL = ("bus", "client", "detokenizer_proc", "formats", "scheduler_proc", "server",
           "tessera", "tokenizer_proc", "worker_proc")
CHIP_NAME = re.compile(r"\b(cuda|cpu|triton|nvidia|nccl|gloo|nvtx|rocm|hip|xpu|mps)\b",
                       re.IGNORECASE)
CHIP_API = re.compile(r"torch\.cuda|\.is_cuda\b|device\.type\b|\bimport triton\b|"
                      r"platform\.name\s*[!=]=|\)\.type\s*[!=]=|pin_memory")
# The worker uses the Platform contract as declared: it does not probe a plugin for methods.
PROBE = re.compile(r"\b(hasattr|getattr)\((self\.)?(platform|runner|plugin)\b")


def sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def tessera_imports(path: Path) -> set[str]:
    """The tessera modules a file imports, at any depth (lazy imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found.update(n for n in names if n.startswith("tessera."))
    return found


def offenders(package: str, pattern: re.Pattern[str]) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
            for path in sources(package)
            for number, line in enumerate(path.read_text().splitlines(), 1)
            if pattern.search(line)]


def test_hal_never_imports_the_bus_or_a_process() -> None:
    bad = {str(p.relative_to(ROOT)): sorted(m for m in tessera_imports(p) if m.split(".")[1]
                                            in ("bus", *PROCESS_PACKAGES))
           for p in sources("hal")}
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_worker_names_no_chip() -> None:
    assert offenders("worker_proc", CHIP_NAME) == []


def test_the_worker_probes_no_plugin() -> None:
    assert offenders("worker_proc", PROBE) == []


@pytest.mark.parametrize("package", NON_HAL)
def test_no_chip_api_outside_hal(package: str) -> None:
    assert offenders(package, CHIP_API) == []


@pytest.mark.parametrize("package", PROCESS_PACKAGES)
def test_a_process_package_imports_no_other(package: str) -> None:
    others = {f"tessera.{p}" for p in PROCESS_PACKAGES} - {f"tessera.{package}"}
    # The server is a client of the bus: the client library is its way in.
    bad = {str(p.relative_to(ROOT)): sorted(m for m in tessera_imports(p)
                                            if any(m == o or m.startswith(o + ".")
                                                   for o in others))
           for p in sources(package)}
    assert {k: v for k, v in bad.items() if v} == {}


def loaded_after_import(modules: list[str]) -> set[str]:
    """Every module loaded by importing `modules` in a fresh interpreter."""
    code = f"import sys\nfor m in {modules!r}: __import__(m)\nprint(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    return set(out.split())


def test_the_control_plane_imports_no_torch() -> None:
    loaded = loaded_after_import([
        "tessera.scheduler_proc.process", "tessera.bus.launcher", "tessera.server.main",
        "tessera.tokenizer_proc.process", "tessera.detokenizer_proc.process", "tessera.client"])
    assert {m.split(".")[0] for m in loaded} & {"torch", "triton"} == set()


def test_loading_a_plugin_loads_no_bus() -> None:
    loaded = loaded_after_import(["tessera.hal.registry", "tessera.hal.cpu",
                                  "tessera.hal.conformance"])
    assert sorted(m for m in loaded if m.startswith("tessera.bus")) == []


def test_the_scheduler_s_parts_do_not_reach_back_into_it() -> None:
    """The planner, running set, invariant check, ... work on the parts they are given and
    return what they decided: only the process module holds a Scheduler."""
    bad = {str(p.relative_to(ROOT)) for p in sources("scheduler_proc")
           if p.name not in ("scheduler.py", "process.py")
           and "tessera.scheduler_proc.scheduler" in tessera_imports(p)}
    assert bad == set()
