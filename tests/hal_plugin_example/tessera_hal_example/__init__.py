"""An example HAL plugin (entry point `example = "tessera_hal_example:ExamplePlatform"`)."""

from tessera_hal_example.platform import ExamplePlatform

__all__ = ["ExamplePlatform"]
