"""Conformance of the runtime half of the Platform contract: events, asynchronous copies,
pinned host buffers, the memory policy, profiler ranges and `GraphRunner.capture`. The tests
are collected through hal/conformance.py, which imports them (its fixtures apply)."""

from __future__ import annotations

import pytest
import torch

from tessera.hal.platform import Event, HostEvent, MemoryPolicy, Platform


def test_an_event_marks_finished_work(hal_platform: Platform) -> None:
    dev = hal_platform.device()
    gen = torch.Generator().manual_seed(31)
    x_host = torch.randn(128, 128, generator=gen)
    x = x_host.to(dev)
    y = x @ x
    event = hal_platform.create_event()
    assert isinstance(event, Event)
    event.record()
    event.synchronize()
    assert event.query()
    torch.testing.assert_close(y.cpu(), x_host @ x_host, atol=1e-3, rtol=1e-3)
    if hal_platform.capabilities.asynchronous:
        # Work queued on the device finishes later: an event that is always complete lies.
        assert not isinstance(event, HostEvent)


def test_copies_round_trip_through_the_device(hal_platform: Platform) -> None:
    dev = hal_platform.device()
    host = torch.arange(1000, dtype=torch.int64)
    on_device = hal_platform.host_to_device(host.clone(), dev)
    assert on_device.device.type == dev.type and on_device.dtype == torch.int64
    back = hal_platform.device_to_host(on_device * 3)
    event = hal_platform.create_event()
    event.record()
    event.synchronize()
    assert back.device.type == "cpu"
    assert torch.equal(back, host * 3)


def test_several_copies_to_the_device_arrive_whole(hal_platform: Platform) -> None:
    """A step's inputs in one call: mixed dtypes and shapes, odd sizes, an empty one."""
    dev = hal_platform.device()
    hosts = [torch.arange(7, dtype=torch.int64), torch.arange(12, dtype=torch.int32).reshape(3, 4),
             torch.zeros((0, 0), dtype=torch.int32), torch.tensor([True, False, True]),
             torch.linspace(0, 1, 5, dtype=torch.float32), torch.arange(3, dtype=torch.int64) - 5]
    out = hal_platform.host_to_device_many([h.clone() for h in hosts], dev)
    assert len(out) == len(hosts)
    for h, d in zip(hosts, out, strict=True):
        assert d.device.type == dev.type and d.dtype == h.dtype and d.shape == h.shape
    backs = [hal_platform.device_to_host(d + 0 if d.dtype != torch.bool else d.clone())
             for d in out]
    event = hal_platform.create_event()
    event.record()
    event.synchronize()
    for h, b in zip(hosts, backs, strict=True):
        assert torch.equal(b, h)


def test_pinned_buffers_are_host_memory_the_device_can_fill(hal_platform: Platform) -> None:
    buf = hal_platform.pinned_empty((3, 5), torch.float32)
    assert buf.shape == (3, 5) and buf.dtype == torch.float32 and buf.device.type == "cpu"
    source = torch.full((3, 5), 1.5, device=hal_platform.device())
    buf.copy_(source, non_blocking=True)
    hal_platform.synchronize()
    assert torch.equal(buf, torch.full((3, 5), 1.5))


def test_memory_policy_is_declared(hal_platform: Platform) -> None:
    policy = hal_platform.memory_policy
    assert isinstance(policy, MemoryPolicy)
    assert 0.0 < policy.default_share <= 1.0
    assert policy.default_max_tokens is None or policy.default_max_tokens > 0


def test_profile_ranges_nest_and_repeat(hal_platform: Platform) -> None:
    for _ in range(2):
        with hal_platform.profile_range("step"), hal_platform.profile_range("forward"):
            pass


def test_capture_warms_up_then_replays_on_new_inputs(hal_platform: Platform) -> None:
    if not hal_platform.capabilities.graph_capture:
        pytest.skip(f"{hal_platform.name} declares no graph capture")
    runner = hal_platform.create_graph_runner()
    assert runner is not None
    dev = hal_platform.device()
    static_in = torch.zeros(4, 8, device=dev)
    weight = torch.randn(8, 3, generator=torch.Generator().manual_seed(32)).to(dev)
    calls: list[int] = []

    def step() -> torch.Tensor:
        calls.append(1)  # Python runs at warm-up and capture only, never at replay
        return torch.relu(static_in @ weight) + 1.0

    out = runner.capture("step", step)
    assert len(calls) == runner.warmup_runs + 1
    for seed in (33, 34):
        new = torch.randn(4, 8, generator=torch.Generator().manual_seed(seed))
        static_in.copy_(new.to(dev))
        runner.replay("step")
        hal_platform.synchronize()
        torch.testing.assert_close(out.cpu(), torch.relu(new @ weight.cpu()) + 1.0,
                                   atol=1e-3, rtol=1e-3)
    assert len(calls) == runner.warmup_runs + 1
    with pytest.raises(KeyError):
        runner.replay("never captured")
    runner.reset()
