"""`--model org/name`: a model already in the local Hugging Face cache.

The cache is the one every Hugging Face tool fills (`huggingface-cli download org/name`,
`from_pretrained`): HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub, as
huggingface_hub resolves it. A model there is a folder `models--org--name` whose
`refs/main` names the snapshot to use. Nothing is ever downloaded here.
"""

from __future__ import annotations

import os
import re

from tessera.formats.errors import ModelFormatError

_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def looks_like_repo_id(model: str) -> bool:
    """`org/name`, and not a path someone meant (./x, ../x, /x, ~/x, a .gguf or .json)."""
    return bool(_REPO_ID.fullmatch(model)) and not model.endswith((".gguf", ".json"))


def hub_cache_dir() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def cached_snapshot(repo_id: str) -> str | None:
    """The snapshot folder of `repo_id` in the cache (refs/main, else the newest snapshot),
    or None if the cache does not hold it."""
    root = os.path.join(hub_cache_dir(), "models--" + repo_id.replace("/", "--"))
    snapshots = os.path.join(root, "snapshots")
    if not os.path.isdir(snapshots):
        return None
    ref = os.path.join(root, "refs", "main")
    if os.path.isfile(ref):
        with open(ref, encoding="utf-8") as f:
            folder = os.path.join(snapshots, f.read().strip())
        if os.path.isdir(folder):
            return folder
    folders = [os.path.join(snapshots, s) for s in os.listdir(snapshots)]
    folders = [f for f in folders if os.path.isdir(f)]
    return max(folders, key=os.path.getmtime) if folders else None


def resolve_repo_id(repo_id: str) -> str:
    """The cached snapshot of `repo_id`, or a ModelFormatError saying where it looked."""
    folder = cached_snapshot(repo_id)
    if folder is None:
        where = os.path.join(hub_cache_dir(), "models--" + repo_id.replace("/", "--"))
        raise ModelFormatError(
            f"model {repo_id!r} is not a local path and is not in the Hugging Face cache "
            f"(looked for {where}); download it first (huggingface-cli download {repo_id}) or "
            f"set HF_HOME to the cache that holds it; tessera never downloads at run time")
    return folder
