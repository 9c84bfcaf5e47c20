"""`tessera doctor --bisect-capture` on the cpu plugin behind a recording graph runner (a
capture records the op calls, a replay calls them again and writes into the captured outputs,
as a device graph does): every op passes; an op that raises under capture, or whose replay
does not follow new inputs, is named first; a plugin without capture says so."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tessera.hal.bisect_capture import bisect_capture
from tessera.hal.doctor import bisect_rows
from tessera.hal.registry import load_platform


class RecordingRunner:
    def __init__(self, broken: dict[str, str]) -> None:
        self.broken = broken  # op name -> "capture" (raises) or "replay" (replays nothing)
        self.capturing: Any = None
        self.graphs: dict[Any, list[tuple[str, Any, tuple[Any, ...], dict[str, Any], Any]]] = {}

    def wrap(self, name: str, fn: Any) -> Any:
        def op(*args: Any, **kwargs: Any) -> Any:
            if self.capturing is not None and self.broken.get(name) == "capture":
                raise RuntimeError(f"{name}: operation not permitted when stream is capturing")
            out = fn(*args, **kwargs)
            if self.capturing is not None:
                self.graphs[self.capturing].append((name, fn, args, kwargs, out))
            return out
        return op

    def begin_capture(self, key: Any) -> None:
        self.capturing = key
        self.graphs[key] = []

    def end_capture(self, key: Any) -> None:
        self.capturing = None

    def replay(self, key: Any) -> None:
        for name, fn, args, kwargs, out in self.graphs[key]:
            if self.broken.get(name) == "replay":
                continue
            new = fn(*args, **kwargs)
            if isinstance(out, torch.Tensor):
                out.copy_(new)
            elif isinstance(out, tuple):
                for o, n in zip(out, new, strict=True):
                    o.copy_(n)

    def reset(self) -> None:
        self.capturing = None
        self.graphs.clear()


class CapturingCpu:
    """The cpu plugin, declaring capture, with the recording runner in front of its ops."""

    def __init__(self, broken: dict[str, str] | None = None) -> None:
        self.inner = load_platform("cpu")
        self.runner = RecordingRunner(broken or {})
        self.name = "cpu-recording"
        self.capabilities = type("Caps", (), {
            "graph_capture": True, "default_dtype": self.inner.capabilities.default_dtype})()

    def op(self, name: str) -> Any:
        return self.runner.wrap(name, self.inner.op(name))

    def create_graph_runner(self) -> RecordingRunner:
        return self.runner

    def device(self, index: int = 0) -> torch.device:
        return self.inner.device()

    def synchronize(self) -> None:
        self.inner.synchronize()


def test_every_op_of_a_step_captures_and_replays_on_a_sound_plugin() -> None:
    results = bisect_capture(CapturingCpu())
    assert [r.op for r in results] == [
        "embedding", "rms_norm", "fused_add_rms_norm", "rotary_embedding", "silu_and_mul",
        "linear", "store_kv", "attention_decode", "attention_extend", "sample"]
    assert all(r.ok for r in results), results


@pytest.mark.parametrize("op,how", [("rotary_embedding", "capture"), ("silu_and_mul", "replay"),
                                    ("store_kv", "replay"), ("attention_decode", "replay")])
def test_the_first_op_that_breaks_under_capture_is_named(op: str, how: str) -> None:
    results = bisect_capture(CapturingCpu({op: how}))
    failed = [r for r in results if not r.ok]
    assert [r.op for r in failed] == [op], results
    assert ("capture raised" if how == "capture" else "replay differs") in failed[0].detail
    rows = bisect_rows(CapturingCpu({op: how}))
    assert rows[-1].status == "FAIL" and op in rows[-1].detail and "T106" in rows[-1].detail


def test_a_plugin_without_capture_has_nothing_to_bisect() -> None:
    rows = bisect_rows(load_platform("cpu"))
    assert len(rows) == 1 and rows[0].status == "info" and "eagerly" in rows[0].detail
