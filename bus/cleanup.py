"""Removal of what a run leaves behind: its run directory (sockets, config, pid file) and its
shared-memory segments (`/dev/shm/tessera_<runid>_*`).

A run that ended cleanly removed its own; one that crashed (supervisor killed with SIGKILL,
machine rebooted mid-run) did not. Before starting, the launcher calls `remove_stale_runs`, which
takes every `tessera-run-*` directory under the run root whose supervisor is gone: its pid file
names a process that no longer exists, or it has no pid file and is older than a minute (a run
that is just starting writes its pid file within milliseconds).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import time
from pathlib import Path

from tessera.bus.run_paths import RUN_PREFIX, RunPaths

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
NO_PID_GRACE_S = 60.0
CHILDREN_FILE = "children.pids"


def pid_alive(pid: int) -> bool:
    """True if a process with this pid exists (zombies included: their parent still lives)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _read_pid(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return None


def remove_shm_segments(paths: RunPaths, shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink every shared-memory segment of this run; return the names removed."""
    prefix = paths.shm_name("")
    removed: list[str] = []
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return removed  # no /dev/shm (not Linux): segments live elsewhere and die with the run
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(shm_dir, name))
                removed.append(name)
            except FileNotFoundError:
                pass  # its owner removed it meanwhile
            except OSError as exc:
                log.warning("could not remove shared memory %s: %s", name, exc)
    return removed


def kill_orphans(paths: RunPaths) -> list[int]:
    """SIGKILL children of a crashed run that outlived their supervisor.

    The supervisor records its children's pids in the run directory; a pid is only killed when
    its command line still names this run directory, so a recycled pid is left alone.
    """
    killed: list[int] = []
    try:
        with open(os.path.join(paths.run_dir, CHILDREN_FILE)) as f:
            pids = [int(line) for line in f if line.strip().isdigit()]
    except OSError:
        return killed
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
        except OSError:
            continue
        if paths.run_dir in cmdline:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except OSError:
                pass
    # Wait (briefly) until they are gone, so that the ports they held are free again.
    deadline = time.monotonic() + 2.0
    while any(pid_alive(p) and not _is_zombie(p) for p in killed) and \
            time.monotonic() < deadline:
        time.sleep(0.02)
    return killed


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def remove_run(paths: RunPaths, shm_dir: str = SHM_DIR, keep_dir: bool = False) -> list[str]:
    """Remove a run's directory and shared memory; return the shm names removed.

    keep_dir: the user named the directory (--run-dir), so remove only what a run puts there.
    """
    removed = remove_shm_segments(paths, shm_dir)
    if not keep_dir:
        shutil.rmtree(paths.run_dir, ignore_errors=True)
        return removed
    ours = ("config.json", "supervisor.pid", CHILDREN_FILE)
    for entry in Path(paths.run_dir).glob("*"):
        if entry.name in ours or entry.suffix == ".sock":
            entry.unlink(missing_ok=True)
    return removed


def has_listener(run_dir: Path) -> bool:
    """True if a socket in the directory accepts connections: someone still uses this run."""
    for sock_path in run_dir.glob("*.sock"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(sock_path))
                return True
            except OSError:
                continue
    return False


def is_stale(run_dir: Path, now: float | None = None) -> bool:
    """A run whose supervisor is gone. Without a pid file (a run directory made by a test or a
    tool rather than `tessera serve`), only when it is old and none of its sockets answers."""
    pid = _read_pid(str(run_dir / "supervisor.pid"))
    if pid is not None:
        return not pid_alive(pid)
    try:
        age = (now or time.time()) - run_dir.stat().st_mtime
    except OSError:
        return False
    return age > NO_PID_GRACE_S and not has_listener(run_dir)


def remove_stale_runs(run_root: str, shm_dir: str = SHM_DIR) -> list[str]:
    """Remove every crashed run under `run_root`; log and return the run directories removed."""
    removed: list[str] = []
    try:
        entries = sorted(Path(run_root).iterdir())
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(RUN_PREFIX) or not entry.is_dir() or entry.is_symlink():
            continue
        if not is_stale(entry):
            continue
        paths = RunPaths(run_dir=str(entry))
        orphans = kill_orphans(paths)
        segments = remove_run(paths, shm_dir)
        log.warning("removed stale run %s (supervisor gone)%s%s", entry,
                    f"; killed orphan pids {orphans}" if orphans else "",
                    f"; shared memory {segments}" if segments else "")
        removed.append(str(entry))
    return removed
