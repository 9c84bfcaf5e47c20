"""API keys, and the rate limits of each.

Keys come from a file (`--api-key-file`) and/or the environment (`TESSERA_API_KEY`), never from
the command line (anyone on the machine reads it in `ps`) and never from the run directory's
config.json: the server reads them itself when it starts. The file holds one key per line,
each optionally followed by its own limits and a name for logs and metrics:

    sk-team-a   rpm=60  tpm=100000  name=team-a
    sk-batch    tpm=2000000
    # comments and blank lines are ignored

rpm: requests per minute; tpm: tokens (prompt + completion) per minute. A key without its own
uses `--key-rpm` / `--key-tpm`; 0 means no limit.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass


class KeyFileError(ValueError):
    """The key file cannot be used (the message names the file, the line and what to do)."""


@dataclass(frozen=True)
class ApiKey:
    name: str  # shown in logs and metrics instead of the secret
    digest: bytes  # SHA-256 of the secret: the secret itself is not kept
    rpm: int = 0
    tpm: int = 0

    def matches(self, given: str) -> bool:
        return hmac.compare_digest(self.digest, _digest(given))


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", errors="surrogateescape")).digest()


def parse_key_line(line: str, number: int, default_rpm: int, default_tpm: int,
                   where: str) -> ApiKey | None:
    text = line.split("#", 1)[0].strip() if not line.lstrip().startswith("#") else ""
    if not text:
        return None
    secret, *options = text.split()
    label = f"key{number}"
    limits = {"rpm": default_rpm, "tpm": default_tpm}
    for option in options:
        name, sep, value = option.partition("=")
        if sep and name == "name":
            label = value
            continue
        if not sep or name not in limits:
            raise KeyFileError(f"{where} line {number}: {option!r} is not rpm=N, tpm=N or "
                               f"name=LABEL")
        if not value.isdigit():
            raise KeyFileError(f"{where} line {number}: {name} must be a whole number, got "
                               f"{value!r}")
        limits[name] = int(value)
    return ApiKey(label, _digest(secret), limits["rpm"], limits["tpm"])


def load_keys(path: str | None, env_key: str | None, default_rpm: int = 0,
              default_tpm: int = 0) -> list[ApiKey]:
    """Every key the server accepts (an empty list: no authentication)."""
    keys: list[ApiKey] = []
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except OSError as exc:
            raise KeyFileError(f"cannot read the API key file {path}: {exc.strerror}") from None
        for number, line in enumerate(lines, 1):
            key = parse_key_line(line, number, default_rpm, default_tpm, path)
            if key is not None:
                keys.append(key)
        if not keys:
            raise KeyFileError(f"the API key file {path} holds no key")
    if env_key:
        keys.append(ApiKey("env", _digest(env_key), default_rpm, default_tpm))
    names = [k.name for k in keys]
    if len(set(names)) != len(names):
        raise KeyFileError(f"two keys share a name in {path}: {sorted(names)}")
    return keys


def find_key(keys: list[ApiKey], authorization: str) -> ApiKey | None:
    """The key an `Authorization: Bearer ...` header carries, if it is one of `keys`. Every
    key is compared (in constant time), so timing does not tell which one nearly matched."""
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer" or not given:
        return None
    found = None
    for key in keys:
        if key.matches(given.strip()):
            found = key
    return found
