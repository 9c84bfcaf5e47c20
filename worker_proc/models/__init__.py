"""Model implementations, one file per architecture family, registered by model_type
(`registry.py`), built from the shared layers in `layers/`."""

from tessera.worker_proc.models.registry import model_class, register, registered_models

__all__ = ["model_class", "register", "registered_models"]
