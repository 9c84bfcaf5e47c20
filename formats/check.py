"""A model checked in a fraction of a second, before any engine process starts: the path
exists, is of a kind tessera reads, and (where a config is at hand) names an architecture it
serves. Opening a model for real (a GGUF's whole metadata, every safetensors header) is the
worker's job; this only catches what a typo or a wrong folder causes, so that `tessera serve`
can say it in one line instead of after every process started."""

from __future__ import annotations

import glob
import os

from tessera.formats.config import ModelConfig
from tessera.formats.errors import ModelFormatError
from tessera.formats.resolve import resolve_model_path

GGUF_MAGIC = b"GGUF"


def check_model(model: str, load_format: str = "auto") -> str:
    """The resolved path of `model`, or a ModelFormatError saying what is wrong with it."""
    from tessera.formats.dummy import read_config_file
    from tessera.formats.hf_folder import read_config_json

    path = resolve_model_path(model)
    if not os.path.exists(path):
        raise ModelFormatError(
            f"model {model!r} not found: pass a Hugging Face folder (config.json + "
            f"*.safetensors), org/name of a model in the Hugging Face cache, a .gguf file, "
            f"'default', or a config JSON with --load-format dummy")
    if os.path.isdir(path):
        ModelConfig.from_hf_dict(read_config_json(path))
        if load_format in ("auto", "safetensors") and \
                not glob.glob(os.path.join(path, "*.safetensors")):
            ggufs = glob.glob(os.path.join(path, "*.gguf"))
            hint = f" (it holds {os.path.basename(ggufs[0])}: pass that file)" if ggufs else ""
            raise ModelFormatError(f"{path} has no *.safetensors weights{hint}; or use "
                                   f"--load-format dummy for random weights of its shape")
        return path
    if not os.access(path, os.R_OK):
        raise ModelFormatError(f"model file {path} cannot be read (permissions)")
    if path.endswith(".gguf") or load_format == "gguf":
        with open(path, "rb") as f:
            if f.read(4) != GGUF_MAGIC:
                raise ModelFormatError(f"{path} is not a GGUF file (it does not start with "
                                       f"'GGUF'); is the download complete?")
        return path
    if load_format == "dummy":
        read_config_file(path)
        return path
    raise ModelFormatError(
        f"{path} is a file but not a .gguf; pass its folder for a Hugging Face model, or "
        f"--load-format dummy for a config JSON")
