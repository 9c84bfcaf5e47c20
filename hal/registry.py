"""Plugin discovery and selection.

Plugins are the built-ins below plus every entry point in the group `tessera.hal`
(`name = "package.module:PlatformClass"`), so a pip-installed package can add a chip without
touching tessera. A plugin module is imported only when it is needed.

Selection: the name passed in (`--hal`), else `TESSERA_HAL`, else the best available plugin
(highest `priority` whose `is_available()` is true). An explicitly named plugin that is
missing, fails to import or is unavailable is fatal: the error gives the cause and the list of
installed plugins. While looking for the best available one, a plugin that fails to import is
skipped with a warning that carries the exception's last line (and `tessera doctor` shows it).
"""

from __future__ import annotations

import importlib
import logging
import traceback
from dataclasses import dataclass
from importlib.metadata import entry_points

from tessera.codes import PLUGIN_MISSING, coded
from tessera.config import Env
from tessera.hal.errors import PluginLoadError, PluginNotFoundError
from tessera.hal.platform import HAL_API_VERSION, Platform

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "tessera.hal"
BUILTIN_PLUGINS: dict[str, str] = {
    "cpu": "tessera.hal.cpu:CpuPlatform",
    "cuda": "tessera.hal.cuda:CudaPlatform",
}


@dataclass(frozen=True)
class PluginSpec:
    name: str
    target: str  # "module:attribute"
    origin: str  # "built-in" or "entry point (distribution version)"


@dataclass(frozen=True)
class PluginStatus:
    """What `tessera doctor` shows for one installed plugin."""

    spec: PluginSpec
    cls: type[Platform] | None
    error: str | None  # the exception's last traceback line if importing failed
    available: bool


def discover_plugins() -> dict[str, PluginSpec]:
    """Every installed plugin by name; a built-in wins over an entry point of the same name."""
    found = {name: PluginSpec(name, target, "built-in") for name, target in
             BUILTIN_PLUGINS.items()}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        known = found.get(ep.name)
        if known is not None:
            if known.target != ep.value:  # tessera's own pyproject repeats the built-ins
                log.warning("HAL plugin %r from entry point %s is shadowed by %s (%s)",
                            ep.name, ep.value, known.target, known.origin)
            continue
        dist = ep.dist
        origin = f"entry point ({dist.name} {dist.version})" if dist else "entry point"
        found[ep.name] = PluginSpec(ep.name, ep.value, origin)
    return found


def describe_installed(plugins: dict[str, PluginSpec] | None = None) -> str:
    plugins = discover_plugins() if plugins is None else plugins
    return ", ".join(f"{s.name} ({s.origin})" for s in plugins.values()) or "none"


def error_line(exc: BaseException) -> str:
    """The last line of the exception's traceback, e.g. "ImportError: no module named x"."""
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


def load_plugin_class(spec: PluginSpec) -> type[Platform]:
    """Import a plugin's Platform class and check it targets this HAL API."""
    module_name, _, attr = spec.target.partition(":")
    try:
        obj = getattr(importlib.import_module(module_name), attr or "Platform")
    except Exception as e:
        raise PluginLoadError(f"HAL plugin {spec.name!r} ({spec.target}, {spec.origin}) failed "
                              f"to import: {error_line(e)}") from e
    if not (isinstance(obj, type) and issubclass(obj, Platform)):
        raise PluginLoadError(f"HAL plugin {spec.name!r}: {spec.target} is not a subclass of "
                              f"tessera.hal.platform.Platform")
    cls: type[Platform] = obj
    if cls.hal_api_version != HAL_API_VERSION:
        raise PluginLoadError(f"HAL plugin {spec.name!r} targets HAL API version "
                              f"{cls.hal_api_version}, this tessera implements "
                              f"{HAL_API_VERSION}; install a matching version of the plugin")
    if cls.name != spec.name:
        raise PluginLoadError(f"HAL plugin registered as {spec.name!r} calls itself "
                              f"{cls.name!r}; the entry-point name and Platform.name must match")
    return cls


def survey_plugins() -> list[PluginStatus]:
    """Import every installed plugin and ask whether it is available; never raises."""
    statuses = []
    for spec in discover_plugins().values():
        try:
            cls = load_plugin_class(spec)
        except PluginLoadError as e:
            # An import failure is shown as its exception's last line; a validation failure
            # (wrong API version, wrong class) as the full message.
            cause = e.__cause__
            statuses.append(PluginStatus(spec, None, error_line(cause) if cause else str(e),
                                         False))
            continue
        try:
            available = bool(cls.is_available())
        except Exception as e:
            statuses.append(PluginStatus(spec, cls, f"is_available() raised {error_line(e)}",
                                         False))
            continue
        statuses.append(PluginStatus(spec, cls, None, available))
    return statuses


def resolve_plugin_name(name: str | None = None) -> tuple[str | None, str]:
    """(explicit name or None, how it was chosen): the argument, else TESSERA_HAL."""
    if name:
        return name, "--hal"
    env_name = Env.read().hal
    if env_name:
        return env_name, "TESSERA_HAL"
    return None, "best available"


def select_plugin_class(name: str | None = None) -> type[Platform]:
    """The Platform class to use (see module doc for the rules)."""
    explicit, how = resolve_plugin_name(name)
    plugins = discover_plugins()
    if explicit is not None:
        spec = plugins.get(explicit)
        if spec is None:
            raise PluginNotFoundError(
                f"HAL plugin {explicit!r} (from {how}) is not installed. Installed plugins: "
                f"{describe_installed(plugins)}. Pick one of them, or install the package "
                f"that provides {explicit!r}." + coded(PLUGIN_MISSING))
        try:
            cls = load_plugin_class(spec)
        except PluginLoadError as e:
            raise PluginLoadError(f"{e}. Installed plugins: {describe_installed(plugins)}"
                                  + coded(PLUGIN_MISSING)) from e.__cause__
        if not cls.is_available():
            raise PluginLoadError(
                f"HAL plugin {explicit!r} (from {how}) is installed but reports no usable "
                f"device on this machine. Installed plugins: {describe_installed(plugins)}"
                + coded(PLUGIN_MISSING))
        return cls
    best: type[Platform] | None = None
    for status in survey_plugins():
        if status.error is not None:
            log.warning("skipping HAL plugin %r: %s", status.spec.name, status.error)
        elif status.available and status.cls is not None and (
                best is None or _priority(status.cls) > _priority(best)):
            best = status.cls
    if best is None:
        raise PluginNotFoundError(f"no available HAL plugin; installed: "
                                  f"{describe_installed(plugins)}" + coded(PLUGIN_MISSING))
    return best


def load_platform(name: str | None = None) -> Platform:
    """Select a plugin (argument, TESSERA_HAL, else best available) and instantiate it."""
    cls = select_plugin_class(name)
    try:
        return cls()
    except Exception as e:
        raise PluginLoadError(f"HAL plugin {cls.name!r} failed to initialise: "
                              f"{error_line(e)}" + coded(PLUGIN_MISSING)) from e


def _priority(cls: type[Platform]) -> int:
    return int(getattr(cls, "priority", 50))
