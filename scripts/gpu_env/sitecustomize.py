"""On PYTHONPATH for a CPU dry run of the GPU benchmarks (benchmarks/run_gpu.sh with DRY=1):
imports of installed distributions that the GPU machine lacks (packages.txt beside this file
lists what it has) fail as they would there, in this process and in every process it starts
(they inherit PYTHONPATH). The refused names are computed once and passed on in
TESSERA_GPU_ENV_REFUSED."""

from __future__ import annotations

import os
import sys

_VAR = "TESSERA_GPU_ENV_REFUSED"


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _refused() -> set[str]:
    if _VAR in os.environ:
        return {n for n in os.environ[_VAR].split(",") if n}
    import importlib.metadata

    here = os.path.dirname(os.path.abspath(__file__))
    image: set[str] = set()
    carried: set[str] = set()
    with open(os.path.join(here, "packages.txt"), encoding="utf-8") as f:
        into = image
        for line in f:
            if line.startswith("# carried"):
                into = carried  # installed with --no-deps: their requirements are not there
            elif not line.startswith("#"):
                into.update(_normal(w) for w in line.split())
    allowed = _with_requirements(image) | carried
    refused = set()
    for module, dists in importlib.metadata.packages_distributions().items():
        if module.isidentifier() and not any(_normal(d) in allowed for d in dists):
            refused.add(module)
    refused -= set(sys.stdlib_module_names)
    os.environ[_VAR] = ",".join(sorted(refused))
    return refused


def _with_requirements(allowed: set[str]) -> set[str]:
    """`allowed` and what its installed distributions require (extras aside): the GPU image's
    own versions bring their own dependencies, which may differ from this machine's."""
    import importlib.metadata
    import re

    todo, seen = list(allowed), set(allowed)
    while todo:
        try:
            requires = importlib.metadata.requires(todo.pop()) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for req in requires:
            if "extra ==" in req or "extra==" in req:
                continue
            name = _normal(re.split(r"[\s\[<>=!~;(]", req.strip(), maxsplit=1)[0])
            if name and name not in seen:
                seen.add(name)
                todo.append(name)
    return seen


class _Refuse:
    """A meta path finder that answers the refused top-level names with ModuleNotFoundError."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        top = fullname.partition(".")[0]
        if top in self.names:
            raise ModuleNotFoundError(
                f"No module named {fullname!r} (not on the GPU machine: "
                f"scripts/gpu_env/packages.txt)", name=fullname)
        return None


sys.meta_path.insert(0, _Refuse(_refused()))
