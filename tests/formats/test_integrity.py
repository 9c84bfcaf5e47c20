"""Weight integrity: the manifest of a model's files, its Ed25519 signature, and the worker
refusing a model that does not match."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.bus.run_paths import RunPaths
from tessera.config import ServerConfig
from tessera.formats.integrity import IntegrityError, hash_model, main, verify_model

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(bytes(range(256)) * 1000)
    (model / "sub" / "tokenizer.json").write_text("{}")
    (model / ".cache").mkdir()
    (model / ".cache" / "lock").write_text("ignored: hidden")
    return model


def write_manifest(model: Path, out: Path, *extra: str) -> Path:
    assert main([str(model), "-o", str(out), *extra]) == 0
    return out


def test_a_manifest_lists_every_file_and_verifies(folder: Path, tmp_path: Path) -> None:
    manifest = write_manifest(folder, tmp_path / "m.json")
    data = json.loads(manifest.read_text())
    assert [f["path"] for f in data["files"]] == ["config.json", "model.safetensors",
                                                  "sub/tokenizer.json"]
    assert data["files"][1]["size"] == 256_000 and len(data["files"][1]["sha256"]) == 64
    assert verify_model(str(folder), str(manifest)) == 3
    assert hash_model(str(folder)).files == hash_model(str(folder)).files


@pytest.mark.parametrize("tamper, words", [
    (lambda m: (m / "model.safetensors").write_bytes(b"\x01" + bytes(range(1, 256)) +
                                                     bytes(range(256)) * 999),
     "has SHA-256"),
    (lambda m: (m / "config.json").write_text('{"model_type": "llama", "x": 1}'), "bytes"),
    (lambda m: (m / "extra.bin").write_bytes(b"x"), "is not in"),
    (lambda m: (m / "sub" / "tokenizer.json").unlink(), "is missing"),
])
def test_a_changed_model_is_refused_naming_the_file(folder: Path, tmp_path: Path, tamper,
                                                   words: str) -> None:  # noqa: ANN001
    manifest = write_manifest(folder, tmp_path / "m.json")
    tamper(folder)
    with pytest.raises(IntegrityError, match=words):
        verify_model(str(folder), str(manifest))


def keypair(tmp_path: Path, name: str) -> tuple[str, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = tmp_path / f"{name}.pem"
    public = tmp_path / f"{name}.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return str(private), str(public)


def test_a_signed_manifest_is_checked_with_the_public_key(folder: Path, tmp_path: Path) -> None:
    private, public = keypair(tmp_path, "ops")
    _, stranger = keypair(tmp_path, "stranger")
    manifest = write_manifest(folder, tmp_path / "m.json", "--sign-key", private)
    assert Path(str(manifest) + ".sig").stat().st_size == 64
    assert verify_model(str(folder), str(manifest), public) == 3
    with pytest.raises(IntegrityError, match="signed by another key"):
        verify_model(str(folder), str(manifest), stranger)
    # A manifest edited to match tampered weights no longer matches its signature.
    (folder / "config.json").write_text("{}")
    data = json.loads(manifest.read_text())
    data["files"][0] = {**data["files"][0], **vars(hash_model(str(folder)).files[0])}
    manifest.write_text(json.dumps(data))
    assert verify_model(str(folder), str(manifest)) == 3  # unsigned check: fooled...
    with pytest.raises(IntegrityError, match="manifest was changed"):
        verify_model(str(folder), str(manifest), public)  # ...the signature is not
    Path(str(manifest) + ".sig").unlink()
    with pytest.raises(IntegrityError, match="cannot read"):
        verify_model(str(folder), str(manifest), public)


def test_a_gguf_file_model_and_a_bad_manifest(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 100)
    manifest = write_manifest(model, tmp_path / "m.json")
    assert verify_model(str(model), str(manifest)) == 1
    (tmp_path / "bad.json").write_text('{"version": 1, "files": 3}')
    with pytest.raises(IntegrityError, match="not a tessera weight manifest"):
        verify_model(str(model), str(tmp_path / "bad.json"))


def test_the_worker_refuses_to_load_a_model_that_does_not_match(tmp_path: Path,
                                                                 run_root: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 100)
    manifest = write_manifest(model, tmp_path / "m.json")
    model.write_bytes(b"GGUF" + b"\1" * 100)
    paths = RunPaths.create(str(run_root / "run"))  # short: its ipc:// paths fit
    Path(paths.config_file).write_text(ServerConfig(model=str(model),
                                                    verify_weights=str(manifest)).to_json())
    done = subprocess.run([sys.executable, "-m", "tessera.worker_proc", "--run-dir",
                           paths.run_dir, "--rank", "0"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0
    assert "IntegrityError" in done.stderr and "the weights were changed" in done.stderr
