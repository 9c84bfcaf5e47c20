"""Run manifests: every `tessera serve` (and every benchmark) records what it ran with, so that
months later one can tell why yesterday's deployment worked and today's does not.

    manifest.json
      id, kind ("serve", "offline", "bench:B3", ...)
      arguments    every engine setting, defaults included (the run directory aside)
      model        path, load format, and per file its size and SHA-256
      versions     tessera (+ commit), python, torch, numpy, ... (package metadata)
      environment  TESSERA_* (never the API key) and the host's thread settings
      hal          the plugin: name, HAL API version, version, SHA-256 of its files,   } from the
                   its libraries' versions and its environment variables              }
      devices      count, names, driver and runtime, topology                          } workers
      run          what differs every time: start time, pid, host, run dir, argv, start-up
                   report, outcome (`tessera manifest diff` leaves it out unless --all)

The supervisor writes it into the run directory and into the runs folder (TESSERA_RUNS_DIR,
else $XDG_STATE_HOME/tessera/runs, else ~/.local/state/tessera/runs) when it starts, again once
every process is ready (the workers' hal and devices, the start-up report) and at the end (the
outcome); the runs folder keeps the newest --runs-keep of them. Model files are hashed once:
hashes are cached by path, size and modification time (hashes.json in the runs folder), and a
file not in the cache is hashed in a background thread after start-up, not before it.
This module reads package metadata only: it imports neither torch nor any process package.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import os
import platform as pyplatform
import shutil
import socket
import threading
from collections.abc import Iterable
from typing import Any

from tessera.version import package_version, source_commit

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
HASH_CACHE = "hashes.json"
VERSIONED = ("tessera", "torch", "numpy", "pyzmq", "msgpack", "aiohttp",
             "safetensors", "gguf", "tokenizers", "xgrammar", "transformers")
# Environment variables that change what runs (the API key is never recorded); the plugin's
# own (device selection, its libraries' switches) come with its facts from the workers.
ENV_RECORDED = ("TESSERA_HAL", "TESSERA_MODEL", "TESSERA_LOG_LEVEL", "OMP_NUM_THREADS",
                "OMP_WAIT_POLICY")
# Arguments that name this run rather than choose how it runs.
VOLATILE_ARGUMENTS = ("run_dir",)


def runs_dir(configured: str | None = None) -> str:
    if configured:
        return configured
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                             "state")
    return os.path.join(state, "tessera", "runs")


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def versions() -> dict[str, str]:
    found = {"python": pyplatform.python_version()}
    for name in VERSIONED:
        v = package_version(name)
        if v is not None:
            found[name] = v
    commit = source_commit()
    if commit:
        found["tessera_commit"] = commit
    return found


def environment() -> dict[str, str]:
    return {k: os.environ[k] for k in ENV_RECORDED if k in os.environ}


def model_files(path: str) -> list[str]:
    """The files a model is read from: a folder's files (not hidden ones), or the file."""
    if os.path.isdir(path):
        out = []
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            out += [os.path.join(root, f) for f in sorted(files) if not f.startswith(".")]
        return out
    return [path] if os.path.isfile(path) else []


class HashCache:
    """SHA-256 of files, remembered by (path, size, mtime_ns) in a JSON file."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.known: dict[str, dict[str, Any]] = {}
        if path and os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as f:
                    self.known = json.load(f)
            except (OSError, ValueError):
                self.known = {}

    @staticmethod
    def _key(path: str) -> tuple[str, int, int]:
        st = os.stat(path)
        return os.path.realpath(path), st.st_size, st.st_mtime_ns

    def lookup(self, path: str) -> str | None:
        real, size, mtime = self._key(path)
        entry = self.known.get(real)
        if entry and entry.get("size") == size and entry.get("mtime_ns") == mtime:
            return str(entry["sha256"])
        return None

    def compute(self, path: str) -> str:
        real, size, mtime = self._key(path)
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                digest.update(chunk)
        value = digest.hexdigest()
        with self.lock:
            self.known[real] = {"size": size, "mtime_ns": mtime, "sha256": value}
            self._save()
        return value

    def _save(self) -> None:
        if not self.path:
            return
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            tmp = f"{self.path}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(self.known, f)
            os.replace(tmp, self.path)
        except OSError as exc:
            log.debug("hash cache not saved: %s", exc)


def describe_model(model: str, load_format: str, cache: HashCache) -> dict[str, Any]:
    """Path and files of the model, with the hashes already known (None: not yet)."""
    try:
        from tessera.formats.resolve import resolve_model_path

        path = resolve_model_path(model)
    except Exception as exc:  # noqa: BLE001 - recorded, the launcher reports it
        return {"name": model, "load_format": load_format, "error": str(exc)}
    files: dict[str, dict[str, Any]] = {}
    base = path if os.path.isdir(path) else os.path.dirname(path)
    for file in model_files(path):
        try:
            size = os.path.getsize(file)
            digest = cache.lookup(file)
        except OSError:
            continue
        files[os.path.relpath(file, base)] = {"size": size, "sha256": digest}
    return {"name": model, "path": os.path.abspath(path), "load_format": load_format,
            "files": files}


class RunManifest:
    """One run's manifest, kept up to date on disk (the run directory and the runs folder)."""

    def __init__(self, kind: str, arguments: dict[str, Any], *, argv: Iterable[str] = (),
                 model: str | None = None, load_format: str = "auto",
                 run_dir: str | None = None, runs_folder: str | None = None, keep: int = 20,
                 run_id: str | None = None) -> None:
        self.lock = threading.Lock()
        self.keep = keep
        self.runs_folder = runs_folder if keep > 0 else None
        self.cache = HashCache(os.path.join(self.runs_folder, HASH_CACHE)
                               if self.runs_folder else None)
        started = _dt.datetime.now(_dt.UTC)
        ident = run_id or f"{os.getpid()}"
        self.id = f"{started.strftime('%Y%m%dT%H%M%SZ')}-{kind.replace(':', '-')}-{ident}"
        self.paths = [os.path.join(run_dir, MANIFEST)] if run_dir else []
        if self.runs_folder:
            self.paths.append(os.path.join(self.runs_folder, self.id, MANIFEST))
        self.data: dict[str, Any] = {
            "id": self.id, "kind": kind,
            "arguments": {k: v for k, v in sorted(arguments.items())
                          if k not in VOLATILE_ARGUMENTS},
            "model": describe_model(model, load_format, self.cache) if model else {},
            "versions": versions(),
            "environment": environment(),
            "hal": {}, "devices": {},
            "run": {"started": started.isoformat(timespec="seconds"), "pid": os.getpid(),
                    "host": socket.gethostname(), "run_dir": run_dir, "argv": list(argv),
                    "outcome": "starting"},
        }

    def update(self, **sections: Any) -> None:
        """Replace top-level sections (`hal=...`) or merge into `run` (`run={...}`)."""
        with self.lock:
            for key, value in sections.items():
                if key == "run":
                    self.data["run"].update(value)
                else:
                    self.data[key] = value
        self.write()

    def write(self) -> None:
        with self.lock:
            text = json.dumps(self.data, indent=1, sort_keys=False) + "\n"
        for path in self.paths:
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                tmp = f"{path}.tmp"
                with open(tmp, "w", encoding="utf-8") as f:
                    f.write(text)
                os.replace(tmp, path)
            except OSError as exc:
                log.warning("could not write the run manifest %s: %s", path, exc)
        self._prune()

    def hash_missing(self, background: bool = True) -> threading.Thread | None:
        """Hash the model files the cache does not know, then write the manifest again."""
        files = self.data.get("model", {}).get("files") or {}
        todo = [name for name, entry in files.items() if entry.get("sha256") is None]
        if not todo:
            return None
        base = self.data["model"]["path"]
        base = base if os.path.isdir(base) else os.path.dirname(base)

        def work() -> None:
            for name in todo:
                try:
                    digest = self.cache.compute(os.path.join(base, name))
                except OSError as exc:
                    log.warning("could not hash %s: %s", name, exc)
                    continue
                with self.lock:
                    files[name]["sha256"] = digest
            self.write()

        if not background:
            work()
            return None
        thread = threading.Thread(target=work, name="manifest-hash", daemon=True)
        thread.start()
        return thread

    def _prune(self) -> None:
        if not self.runs_folder:
            return
        try:
            runs = sorted(d for d in os.listdir(self.runs_folder)
                          if os.path.isfile(os.path.join(self.runs_folder, d, MANIFEST)))
        except OSError:
            return
        for old in runs[:-self.keep]:
            if old != self.id:
                shutil.rmtree(os.path.join(self.runs_folder, old), ignore_errors=True)


def platform_sections(children_info: Iterable[tuple[str, dict[str, Any]]]
                      ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The `hal` and `devices` sections from the workers' Ready info (their `platform`)."""
    hal: dict[str, Any] = {}
    devices: dict[str, Any] = {"ranks": {}}
    for name, info in children_info:
        facts = info.get("platform")
        if not name.startswith("worker") or not isinstance(facts, dict):
            continue
        hal = facts.get("plugin") or hal
        devices["ranks"][name] = info.get("device")
        for key in ("count", "names", "driver", "runtime", "topology"):
            if key in (facts.get("devices") or {}):
                devices[key] = facts["devices"][key]
    return hal, devices
