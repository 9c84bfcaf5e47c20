"""What a run manifest records about the hardware side, asked of a loaded plugin: its name,
HAL API version, version and a SHA-256 of its files; the devices it sees, their driver and
runtime versions and how they are connected. A plugin tells what it can through the optional
`versions()` (name -> text; "device", "driver", "runtime", "topology" are read here),
`device_count()` and `environment_variables` (the values set of those are recorded); nothing
here names a chip."""

from __future__ import annotations

import hashlib
import os
import sys
from importlib.metadata import packages_distributions, version
from typing import Any


def plugin_files_sha256(module_name: str) -> str | None:
    """SHA-256 over the plugin package's .py files (names and contents, in name order)."""
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None)
    if path is None:
        return None
    folder = os.path.dirname(path)
    top = module_name.split(".")
    # The plugin's own package: for tessera.hal.cuda.platform, the folder of tessera.hal.cuda.
    if os.path.basename(path) != "__init__.py" and len(top) > 1:
        parent = sys.modules.get(".".join(top[:-1]))
        if getattr(parent, "__file__", None):
            folder = os.path.dirname(parent.__file__)  # type: ignore[arg-type,union-attr]
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            full = os.path.join(root, name)
            digest.update(os.path.relpath(full, folder).encode())
            with open(full, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()


def _distribution_version(module_name: str) -> str | None:
    top = module_name.split(".")[0]
    for dist in packages_distributions().get(top, []):
        try:
            return version(dist)
        except Exception:  # noqa: BLE001 - metadata of another package may be broken
            continue
    return None


def platform_facts(platform: Any) -> dict[str, Any]:
    module = type(platform).__module__
    reported: dict[str, str] = {}
    try:
        reported = {str(k): str(v) for k, v in getattr(platform, "versions", dict)().items()}
    except Exception as exc:  # noqa: BLE001 - facts are best effort, never fatal
        reported = {"error": str(exc)}
    try:
        count = int(platform.device_count())
    except Exception:  # noqa: BLE001
        count = 0
    devices: dict[str, Any] = {"count": count}
    for key in ("names", "driver", "runtime", "topology"):
        if key in reported:
            devices[key] = reported[key]
    if "names" not in devices and "device" in reported:
        devices["names"] = reported["device"]
    return {
        "plugin": {"name": platform.name,
                   "hal_api_version": getattr(platform, "hal_api_version", None),
                   "module": module, "version": _distribution_version(module),
                   "files_sha256": plugin_files_sha256(module),
                   "reported": reported,
                   "environment": {k: os.environ[k]
                                   for k in getattr(platform, "environment_variables", ())
                                   if k in os.environ}},
        "devices": devices,
    }
