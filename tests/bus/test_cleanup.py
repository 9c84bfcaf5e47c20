"""Stale-run detection and removal, on directories made to look like crashed runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tessera.bus.channel import Inbox
from tessera.bus.cleanup import is_stale, remove_run, remove_shm_segments, remove_stale_runs
from tessera.bus.run_paths import RunPaths


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def make_run(root: Path, name: str, pid: int | None, age_s: float = 0.0) -> RunPaths:
    paths = RunPaths.create(str(root / f"tessera-run-{name}"))
    if pid is not None:
        Path(paths.pid_file).write_text(f"{pid}\n")
    if age_s:
        old = time.time() - age_s
        os.utime(paths.run_dir, (old, old))
    return paths


def test_dead_supervisor_means_stale_live_means_not(run_root: Path) -> None:
    assert is_stale(Path(make_run(run_root, "dead0001", dead_pid()).run_dir))
    assert not is_stale(Path(make_run(run_root, "live0001", os.getpid()).run_dir))


def test_no_pid_file_is_stale_only_when_old_and_unused(run_root: Path) -> None:
    young = make_run(run_root, "young001", None)
    old = make_run(run_root, "old00001", None, age_s=120)
    used = make_run(run_root, "used0001", None, age_s=120)
    inbox = Inbox(used.scheduler)  # a live socket: some process still works in this run
    os.utime(used.run_dir, (time.time() - 120,) * 2)
    try:
        assert not is_stale(Path(young.run_dir))
        assert is_stale(Path(old.run_dir))
        assert not is_stale(Path(used.run_dir))
    finally:
        inbox.close()


def test_remove_stale_runs_takes_only_crashed_runs_and_their_shm(run_root: Path,
                                                                 tmp_path: Path) -> None:
    shm_dir = tmp_path / "shm"
    shm_dir.mkdir()
    crashed = make_run(run_root, "crash001", dead_pid())
    live = make_run(run_root, "alive001", os.getpid())
    (shm_dir / crashed.shm_name("req_to_token")).touch()
    (shm_dir / live.shm_name("req_to_token")).touch()
    (run_root / "unrelated-dir").mkdir()
    removed = remove_stale_runs(str(run_root), shm_dir=str(shm_dir))
    assert removed == [crashed.run_dir]
    assert sorted(p.name for p in shm_dir.iterdir()) == [live.shm_name("req_to_token")]
    assert os.path.isdir(live.run_dir) and (run_root / "unrelated-dir").is_dir()


def test_shm_prefix_does_not_touch_other_runs(tmp_path: Path) -> None:
    a, b = RunPaths(str(tmp_path / "tessera-run-abc")), RunPaths(str(tmp_path / "tessera-run-abcd"))
    (tmp_path / a.shm_name("x")).touch()
    (tmp_path / b.shm_name("x")).touch()
    assert remove_shm_segments(a, shm_dir=str(tmp_path)) == [a.shm_name("x")]
    assert (tmp_path / b.shm_name("x")).exists()


def test_keep_dir_removes_only_what_a_run_puts_there(tmp_path: Path) -> None:
    paths = RunPaths.create(str(tmp_path / "mine"))
    for name in ("config.json", "supervisor.pid", "scheduler.sock", "notes.txt"):
        Path(paths.run_dir, name).touch()
    remove_run(paths, shm_dir=str(tmp_path), keep_dir=True)
    assert sorted(os.listdir(paths.run_dir)) == ["notes.txt"]
    remove_run(paths, shm_dir=str(tmp_path))
    assert not os.path.exists(paths.run_dir)
