"""The reference `cpu` plugin (entry point `tessera.hal.cpu:CpuPlatform`)."""

from tessera.hal.cpu.platform import CpuPlatform

__all__ = ["CpuPlatform"]
