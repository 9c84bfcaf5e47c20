"""Run directory: where a running engine's sockets, config and shared memory are named."""

from __future__ import annotations

import hashlib
import os
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tessera.config import Env

RUN_PREFIX = "tessera-run-"
SHM_PREFIX = "tessera_"


@dataclass(frozen=True)
class RunPaths:
    """Endpoints and shared-memory names of one running engine.

    The run directory is private (mode 0700) and holds the ipc sockets, the config JSON and a
    pid file of the supervisor, so a later start can tell a crashed run from a live one.
    """

    run_dir: str

    @classmethod
    def create(cls, run_dir: str | None = None, env: Env | None = None) -> RunPaths:
        if run_dir is None:
            root = (env or Env.read()).run_root or tempfile.gettempdir()
            os.makedirs(root, exist_ok=True)
            run_dir = tempfile.mkdtemp(prefix=RUN_PREFIX, dir=root)
        os.makedirs(run_dir, mode=0o700, exist_ok=True)
        os.chmod(run_dir, 0o700)
        return cls(run_dir=str(Path(run_dir).resolve()))

    @property
    def run_id(self) -> str:
        """Unique per run directory: shared-memory names are machine-wide, so a directory not
        made by `create` (any name) gets a hash of its full path."""
        name = Path(self.run_dir).name
        if name.startswith(RUN_PREFIX):
            return name.removeprefix(RUN_PREFIX)
        return hashlib.sha1(self.run_dir.encode()).hexdigest()[:12]

    def _ipc(self, name: str) -> str:
        return f"ipc://{self.run_dir}/{name}.sock"

    @property
    def tokenizer(self) -> str:
        return self._ipc("tokenizer")

    def tokenizer_endpoint(self, index: int) -> str:
        """Tokenizer worker `index` of `--tokenizer-workers N`; index 0 is `tokenizer`."""
        return self.tokenizer if index == 0 else self._ipc(f"tokenizer{index}")

    @property
    def scheduler(self) -> str:
        return self._ipc("scheduler")

    @property
    def scheduler_results(self) -> str:
        return self._ipc("scheduler-results")

    def worker(self, rank: int) -> str:
        return self._ipc(f"worker{rank}")

    @property
    def detokenizer(self) -> str:
        return self._ipc("detokenizer")

    @property
    def supervisor(self) -> str:
        return self._ipc("supervisor")

    @property
    def status(self) -> str:
        return self._ipc("status")

    def client_endpoint(self) -> str:
        """A fresh reply_to endpoint for one client."""
        return self._ipc(f"client-{os.getpid()}-{secrets.token_hex(4)}")

    @property
    def tp_rendezvous(self) -> str:
        """The file tensor-parallel worker ranks meet through (torch.distributed file://)."""
        return os.path.join(self.run_dir, "tp-rendezvous")

    @property
    def config_file(self) -> str:
        return os.path.join(self.run_dir, "config.json")

    @property
    def pid_file(self) -> str:
        return os.path.join(self.run_dir, "supervisor.pid")

    @property
    def shm_req_to_token(self) -> str:
        return f"{SHM_PREFIX}{self.run_id}_req_to_token"

    def shm_name(self, what: str) -> str:
        return f"{SHM_PREFIX}{self.run_id}_{what}"
