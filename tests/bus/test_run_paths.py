"""Run directory names: endpoints and shared-memory segments of one engine."""

from __future__ import annotations

from tessera.bus.run_paths import RunPaths


def test_run_paths_names(run_root) -> None:  # type: ignore[no-untyped-def]
    paths = RunPaths.create()
    assert paths.run_dir.startswith(str(run_root))
    assert paths.shm_req_to_token == paths.shm_name("req_to_token")
    assert paths.shm_name("").startswith("tessera_") and paths.run_id in paths.shm_name("")
    assert paths.client_endpoint() != paths.client_endpoint()
