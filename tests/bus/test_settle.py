"""Reading figures that arrive late: two agreeing reads, compared by what counts work."""

from __future__ import annotations

import pytest

from tessera.bus.settle import read_settled


def test_agreement_is_judged_by_the_key_and_waits_for_ready() -> None:
    # cpu_s moves with every read (a gauge); the work counter arrives late, then holds.
    reads = iter([{"steps": 3, "cpu_s": 1}, {"steps": 7, "cpu_s": 2}, {"steps": 7, "cpu_s": 3},
                  {"steps": 7, "cpu_s": 4}])
    got = read_settled(lambda: next(reads), 0.0, 10.0, key=lambda s: s["steps"])
    assert got == {"steps": 7, "cpu_s": 3}


def test_never_ready_is_a_timeout_naming_what() -> None:
    with pytest.raises(TimeoutError, match="the counters did not settle"):
        read_settled(dict, 0.01, 0.05, ready=bool, what="the counters")
