"""The start-up report: phases along the critical path that add up to ready_s."""

from __future__ import annotations

import math

from tessera.bus.startup import ProcessTimes, startup_report


def test_phases_follow_the_critical_path_and_add_up() -> None:
    worker = {"phases": {"platform": 0.5, "weights": 2.0, "kv_arena": 0.25,
                         "graph_capture": 4.0, "graph_capture_decode": 3.0,
                         "graph_decode_sizes": 23.0}}
    fast_worker = {"phases": {"weights": 1.0}}
    procs = [ProcessTimes("worker0", 0, spawned=10.0, ready=18.0, info=worker),
             ProcessTimes("worker1", 0, spawned=10.0, ready=15.0, info=fast_worker),
             ProcessTimes("tokenizer0", 0, spawned=10.0, ready=12.0),
             ProcessTimes("server", 1, spawned=18.5, ready=20.0,
                          info={"phases": {"warmup": 0.75}})]
    report = startup_report(launched=9.0, processes=procs)
    assert report.ready_s == 11.0
    assert report.stages == {"0": 8.0, "1": 1.5}
    # the slowest rank's phases; warm-up from the server; the rest is processes coming up
    assert report.phases == {"processes_up": 2.0, "platform": 0.5, "weights": 2.0,
                             "kv_arena": 0.25, "graph_capture": 4.0, "warmup": 0.75,
                             "other": 1.5}
    assert math.isclose(sum(report.phases.values()), report.ready_s)
    assert report.detail == {"graph_capture_decode": 3.0, "graph_decode_sizes": 23.0}
    assert report.line().startswith("ready in 11.0 s (processes up 2.0 s, platform 0.5 s")


def test_no_process_is_an_empty_report() -> None:
    assert startup_report(0.0, []).ready_s == 0.0
