"""The cuda plugin's on/off environment switches (HAL_CUDA_*), read one way: ON and OFF are
the words every HAL_CUDA_* variable takes for on and off (the ones with more modes too)."""

from __future__ import annotations

import os

ON = ("1", "on", "true", "yes")
OFF = ("0", "off", "false", "no")


def switch(variable: str, default: bool, value: str | None = None) -> bool:
    """Whether `variable` (or `value`, when given: tests) turns its feature on: unset or
    empty the default, 1 / on / true / yes or 0 / off / false / no, anything else a clear
    error naming the variable."""
    text = (os.environ.get(variable) if value is None else value) or ""
    text = text.strip().lower()
    if not text:
        return default
    if text not in ON + OFF:
        raise ValueError(f"{variable}={text!r}: expected 1 or 0 (unset: "
                         f"{'1' if default else '0'})")
    return text in ON
