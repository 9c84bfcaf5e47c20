"""Installs throw-away plugins for the registry tests: a module plus a hand-written
*.dist-info folder with an entry_points.txt, which is all importlib.metadata needs to find an
entry point on sys.path."""

from __future__ import annotations

import textwrap
from pathlib import Path

GOOD = '''
from tessera.hal.cpu.platform import CpuPlatform

class Platform(CpuPlatform):
    name = "{name}"
'''

BROKEN = '''
raise RuntimeError("boom: the fake driver is missing")
'''

OLD_API = '''
from tessera.hal.cpu.platform import CpuPlatform

class Platform(CpuPlatform):
    name = "{name}"
    hal_api_version = 0
'''


def install_fake_plugin(root: Path, name: str, source: str, module: str | None = None) -> None:
    module = module or f"fake_hal_{name}"
    (root / f"{module}.py").write_text(textwrap.dedent(source.format(name=name)))
    info = root / f"{module.replace('_', '-')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[tessera.hal]\n{name} = {module}:Platform\n")
