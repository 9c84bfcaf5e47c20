"""Model files: Hugging Face folders, GGUF files and dummy weights behind one interface.

    from tessera.formats import open_model
    files = open_model("default")
    files.config          # ModelConfig
    files.iter_tensors()  # (hf_name, tensor) one at a time
    files.gguf_metadata   # raw GGUF key/values (tokenizer, chat template) or None
"""

from tessera.formats.config import SUPPORTED_ARCHS, ModelConfig
from tessera.formats.errors import ModelFormatError, UnsupportedModelError, WeightShapeError
from tessera.formats.layout import hf_tensor_shapes
from tessera.formats.model_files import ModelFiles
from tessera.formats.resolve import DEFAULT_MODEL, default_model_path, open_model

__all__ = [
    "DEFAULT_MODEL",
    "SUPPORTED_ARCHS",
    "ModelConfig",
    "ModelFiles",
    "ModelFormatError",
    "UnsupportedModelError",
    "WeightShapeError",
    "default_model_path",
    "hf_tensor_shapes",
    "open_model",
]
