"""The model registry: model_type (config.json) -> the class that runs it.

Each architecture family is one file in this package that decorates its class with
`@register("model_type", ...)`; the files are found by listing the package, so adding a family
touches only its own file (and its model_type's config keys in `formats/config.py`).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

_MODELS: dict[str, type] = {}
_NOT_FAMILIES = {"base", "context", "registry", "layers"}


def register(*model_types: str) -> Any:
    def wrap(cls: type) -> type:
        for name in model_types:
            if name in _MODELS and _MODELS[name] is not cls:
                raise ValueError(f"model_type {name!r} registered twice: "
                                 f"{_MODELS[name].__name__} and {cls.__name__}")
            _MODELS[name] = cls
        return cls
    return wrap


def _import_families() -> None:
    import tessera.worker_proc.models as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name not in _NOT_FAMILIES:
            importlib.import_module(f"{pkg.__name__}.{info.name}")


def registered_models() -> dict[str, type]:
    """model_type -> class, for every family file in this package."""
    _import_families()
    return dict(_MODELS)


def model_class(model_type: str) -> Any:
    models = registered_models()
    if model_type not in models:
        raise ValueError(f"no model implementation for {model_type!r}; have "
                         f"{', '.join(sorted(models))}")
    return models[model_type]
