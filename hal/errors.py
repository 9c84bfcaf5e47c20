"""Errors of the HAL a user can cause: each says what was wrong and what to do."""

from __future__ import annotations


class HalError(RuntimeError):
    """Base of every HAL error."""


class PluginNotFoundError(HalError):
    """An explicitly named plugin is not installed."""


class PluginLoadError(HalError):
    """A plugin is installed but importing or validating it failed."""


class MissingOpError(HalError, NotImplementedError):
    """A plugin has neither an implementation nor a declared reference fallback for an op."""

    def __init__(self, op: str, plugin: str, registered: list[str]) -> None:
        self.op = op
        self.plugin = plugin
        self.registered = registered
        shown = ", ".join(registered) or "none"
        super().__init__(
            f"HAL plugin {plugin!r} has no op {op!r} (registered: {shown}). Implement it in the "
            f"plugin, or declare it in `reference_fallbacks` to use the cpu reference explicitly."
        )


class MissingSchemeError(HalError, NotImplementedError):
    """A plugin runs a quantization scheme neither natively nor through a declared reference
    fallback."""

    def __init__(self, scheme: str, plugin: str, native: tuple[str, ...],
                 fallbacks: tuple[str, ...]) -> None:
        self.scheme = scheme
        self.plugin = plugin
        super().__init__(
            f"HAL plugin {plugin!r} does not run quantization scheme {scheme!r} (native: "
            f"{', '.join(native) or 'none'}; reference fallbacks: "
            f"{', '.join(fallbacks) or 'none'}). Serve with --quantization none to dequantize "
            f"the weights at load, or implement the scheme in the plugin (or list it in "
            f"`reference_quant_fallbacks` to run the slow reference explicitly).")
