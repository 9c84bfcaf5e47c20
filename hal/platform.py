"""The Platform contract: what a hardware plugin supplies (ARCHITECTURE.md, "The HAL").

A plugin is a subclass of `Platform` registered as a built-in (`hal/registry.py`) or through
the entry-point group `tessera.hal`. The control plane (scheduler, radix cache, KV mapping)
never imports this: only worker processes do.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import torch

if TYPE_CHECKING:
    from tessera.hal.quant.weight import QuantizedWeight

HAL_API_VERSION = 1


@dataclass(frozen=True)
class Capabilities:
    graph_capture: bool = False
    # Work is queued and runs after the call returns (events and the async copies then matter);
    # False: every op has finished when it returns.
    asynchronous: bool = False
    dtypes: tuple[str, ...] = ("float32",)  # serving dtypes the plugin supports
    default_dtype: str = "float32"
    max_capture_batch: int = 0
    # Any number of ranks may share one device (host memory and threads): device_count() is
    # no limit on --tp-size x --pp-size.
    devices_shared: bool = False
    communicator_backends: tuple[str, ...] = ()
    # Quantization schemes (hal/quant: fp8, int8, int4) whose `linear` the plugin runs with
    # kernels of its own; see Platform.linear_kernel for the others.
    quant_schemes: tuple[str, ...] = ()
    # KV cache dtypes besides the serving dtype ("fp8_e4m3": half the bytes per token, stored
    # with per-layer scales; the attention ops read it directly).
    kv_cache_dtypes: tuple[str, ...] = ()
    # Steps the scheduler keeps in flight under --overlap-steps 0 (auto), 2 to 4: 3 where a
    # device step can be shorter than the host's round trip for the next one (fast decode
    # steps), 2 where it never is (each step more in flight sees a request's end a step later).
    overlap_steps: int = 2
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MemoryPolicy:
    """How much of `mem_get_info()`'s free memory the worker may give the KV cache.

    A device's memory is the engine's own: --mem-fraction of what was free before the weights
    is the budget for weights + KV. Memory shared with the host (`shared_with_host`) is also
    everyone else's on the machine: without --max-total-tokens the KV cache takes at most
    `default_share` of what is free and `default_max_tokens` slots.
    """

    shared_with_host: bool = False
    default_share: float = 1.0
    default_max_tokens: int | None = None


def _same(weight: QuantizedWeight) -> QuantizedWeight:
    return weight


class RotaryStore(NamedTuple):
    """What one_token_fused's rope fusion needs: rotary_store_kv's arguments but q, k, v
    (hal/ops.py), which are the product's [q | k | v] columns, heads of head_dim."""

    positions: torch.Tensor  # int64 [1]
    cos_sin: torch.Tensor  # [P, head_dim]
    k_cache: torch.Tensor  # [S, kv_heads, head_dim]
    v_cache: torch.Tensor
    slots: torch.Tensor  # int64 [1]
    q_heads: int
    kv_heads: int
    head_dim: int


def _never(weight: QuantizedWeight) -> bool:
    del weight
    return False


@dataclass(frozen=True)
class QuantLinearKernel:
    """The `linear` op for one quantization scheme: y = x @ dequantize(w)^T (+ bias), with the
    accuracy hal/conformance_quant.py states for the scheme.

    `prepare` runs once per weight at load and returns it in the layout `apply` reads (a
    repacking, a transpose; by default the weight as it is); `apply(x[T, In], w, bias) ->
    [T, Out]` in x.dtype. Resolve it with `Platform.linear_kernel(scheme)`, once per layer.

    Optional, for a decode step of one token: `one_token_fused(x[1, In], w, bias, *,
    norm=None, residual=None, silu=False)`, the product with its neighbours in one launch,
    defined as the composition (hal/quant/reference.py `one_token_fused_reference`):

        h = rms_norm(x, g, eps) if norm == (g, eps) else x
        y = apply(h, w, bias)
        y = silu_and_mul(y)  if silu            ([1, Out / 2]: w's rows are [gate | up])
        y = y + residual     if residual given  ([1, Out], rounded as the add rounds)
        y = rotary_store_kv(rope.positions, q, k, v, rope.cos_sin, rope.k_cache,
                            rope.v_cache, rope.slots)   if rope (a RotaryStore) given
            ([1, q_heads * head_dim]: q, k, v the [q | k | v] columns of y as heads)

    (norm with silu or rope, or each alone; silu, residual and rope exclude each other),
    with the scheme's tolerance plus the rounding of the normed x the composition makes.
    `fuses(w)` says whether the plugin runs it in one launch for this prepared weight: a
    model takes the fused path only where every linear of it does, since its composition
    costs more launches than the fused_add_rms_norm it replaces.

    Optional, for a step of any number of tokens: `rows_fused(x[T, In], w, bias, *,
    norm=None, residual=None, silu=False) -> (y, residual_out)`, the product with the op
    before it, defined as the composition (hal/quant/reference.py `rows_fused_reference`):

        h, residual_out = fused_add_rms_norm(x, residual, g, eps)  if norm and residual
        h, residual_out = rms_norm(x, g, eps), None                if norm alone
        h, residual_out = silu_and_mul(x), None                    if silu  ([T, In * 2] in)
        y = apply(h, w, bias)

    (one of norm and silu; a residual only with a norm), residual_out exactly the
    composition's and y within the scheme's tolerance. A plugin fuses where it gains (fp8:
    the activations' quantization in the norm's or the SiLU's kernel, no launch of its own)
    and composes elsewhere, so a model may call it for every step.
    """

    scheme: str
    apply: Callable[[torch.Tensor, QuantizedWeight, torch.Tensor | None], torch.Tensor]
    prepare: Callable[[QuantizedWeight], QuantizedWeight] = _same
    one_token_fused: Callable[..., torch.Tensor] | None = None
    fuses: Callable[[QuantizedWeight], bool] = _never
    rows_fused: Callable[..., tuple[torch.Tensor, torch.Tensor | None]] | None = None

    def __call__(self, x: torch.Tensor, w: QuantizedWeight,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
        return self.apply(x, w, bias)


class KVArena:
    """The KV cache: one allocation at start-up, carved into per-layer K and V views.

    Layout: k[layer] and v[layer] are [num_slots, kv_heads, head_dim]. Slot s of every layer
    belongs to the same token. Slots 0 .. page_size-1 (page 0) are reserved for padding: graph
    replay of a padded batch writes there, and the scheduler never hands page 0 out.
    """

    def __init__(self, storage: torch.Tensor, num_layers: int, num_slots: int, kv_heads: int,
                 head_dim: int) -> None:
        expected = (num_layers, 2, num_slots, kv_heads, head_dim)
        if tuple(storage.shape) != expected:
            raise ValueError(f"KV storage shape {tuple(storage.shape)}, expected {expected}")
        self.storage = storage
        self.num_layers = num_layers
        self.num_slots = num_slots
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.k = [storage[i, 0] for i in range(num_layers)]
        self.v = [storage[i, 1] for i in range(num_layers)]

    @staticmethod
    def bytes_per_slot(num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return num_layers * 2 * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


class GraphRunner(ABC):
    """Captures the work queued between `begin_capture(key)` and `end_capture(key)` at static
    shapes and replays it on the current contents of the same buffers. Plugins without capture
    declare `Capabilities.graph_capture = False`, return no runner, and the worker runs
    eagerly.

    Inputs live in static buffers the caller owns and refills before each replay; outputs are
    the tensors the captured work wrote, rewritten in place by every replay.
    """

    warmup_runs: int = 2

    @abstractmethod
    def begin_capture(self, key: Any) -> None: ...

    @abstractmethod
    def end_capture(self, key: Any) -> None: ...

    @abstractmethod
    def replay(self, key: Any) -> None: ...

    @abstractmethod
    def reset(self) -> None: ...

    def warm_up(self, fn: Callable[[], Any]) -> None:
        """Run `fn` eagerly as the capture will (kernels compile, libraries choose their
        workspaces: none of that may happen inside a capture)."""
        for _ in range(self.warmup_runs):
            fn()

    def capture(self, key: Any, fn: Callable[[], Any]) -> Any:
        """Warm `fn` up, capture one call of it as `key` and return its output tensors,
        which every `replay(key)` rewrites."""
        self.warm_up(fn)
        self.begin_capture(key)
        try:
            out = fn()
        finally:
            self.end_capture(key)
        return out


class Event(ABC):
    """A mark in the device's queue of work."""

    @abstractmethod
    def record(self) -> None:
        """Mark the point after everything queued so far."""

    @abstractmethod
    def query(self) -> bool:
        """Whether everything before the mark has finished; never waits."""

    @abstractmethod
    def synchronize(self) -> None:
        """Wait until everything before the mark has finished."""


class HostEvent(Event):
    """The event of a synchronous plugin: work has finished when its call returns."""

    def record(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class Transfer:
    """A point-to-point transfer queued by Communicator.isend / irecv. This one is complete
    when made (the blocking default); plugins return their own."""

    def __init__(self, tensor: torch.Tensor | None = None) -> None:
        self.tensor = tensor

    def wait(self) -> torch.Tensor | None:
        """Work this rank queues after this call sees the transfer complete (an asynchronous
        device: in stream order, without blocking the host). Returns the received tensor (an
        irecv) or None."""
        return self.tensor

    def done(self) -> bool:
        """Whether the transfer has completed (a sent tensor may then be freed)."""
        return True


class Communicator(ABC):
    """Collectives among a group of ranks (the tensor-parallel ranks of a stage, or every
    worker for the pipeline's point-to-point sends). `world_size == 1` short-circuits every
    call. `rank` and the ranks `send`/`recv` name are ranks within this communicator."""

    rank: int
    world_size: int

    def split(self, groups: list[list[int]]) -> Communicator:
        """The communicator of the group holding this rank. Every rank calls it with the same
        disjoint `groups` (ranks of this communicator) in the same order; a group's ranks are
        renumbered 0.. in ascending order (as torch.distributed numbers them). The new
        communicator is torn down with this one."""
        mine = [g for g in groups if self.rank in g]
        if len(mine) != 1 or sorted(r for g in groups for r in g) != list(range(self.world_size)):
            raise ValueError(f"split: groups {groups} must cover ranks 0..{self.world_size - 1} "
                             f"once each")
        if mine[0] == list(range(self.world_size)):
            return self
        raise NotImplementedError(f"{type(self).__name__} cannot be split into groups")

    def configure(self, *, one_shot_max_bytes: int, dtype: torch.dtype) -> str:
        """Engine hints, called by every rank of the group at the same point after creation:
        all-reduces of `dtype` up to `one_shot_max_bytes` may take a faster path the plugin
        offers (a collective set-up). Returns what was chosen, for the log."""
        del one_shot_max_bytes, dtype
        return "default collectives"

    @property
    def one_shot_max_bytes(self) -> int:
        """The largest all-reduce that takes the faster path `configure` set up (0: none),
        reported in the worker's stats."""
        return 0

    def abort(self) -> None:
        """Leave the group at once, even with collectives a peer will never join (shutdown
        while a step is half done). By default the same as destroy()."""
        self.destroy()

    @abstractmethod
    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor: ...

    @abstractmethod
    def all_gather(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor: ...

    @abstractmethod
    def reduce_scatter(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor: ...

    @abstractmethod
    def send(self, tensor: torch.Tensor, dst: int) -> None: ...

    @abstractmethod
    def recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor: ...

    def isend(self, tensor: torch.Tensor, dst: int) -> Transfer:
        """Queue a send of `tensor` (produced by work already queued) to `dst` without making
        this rank's later work wait for it: a pipeline stage goes on to its next step while
        the next stage is still busy. Keep the Transfer until done(). By default: send()."""
        self.send(tensor, dst)
        return Transfer()

    def irecv(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
              src: int) -> Transfer:
        """Post a receive from `src` into a new tensor now, ahead of work this rank has already
        queued; wait() returns the tensor, and the work queued after it sees the data. By
        default: recv()."""
        buf = torch.empty(shape, dtype=dtype, device=device)
        self.recv(buf, src)
        return Transfer(buf)

    @abstractmethod
    def barrier(self) -> None: ...

    @abstractmethod
    def destroy(self) -> None: ...


class Platform(ABC):
    """One chip's data plane. Subclasses set `name`, `capabilities` and register ops.

    The worker reaches the chip only through this class. The methods with a body are right for
    a synchronous plugin whose device memory is host memory; an asynchronous one overrides the
    events and copies (the conformance suite checks them either way).
    """

    name: ClassVar[str] = ""
    hal_api_version: ClassVar[int] = HAL_API_VERSION
    capabilities: ClassVar[Capabilities] = Capabilities()
    memory_policy: ClassVar[MemoryPolicy] = MemoryPolicy()
    # Environment variables that change what this plugin runs (device selection, its
    # libraries' switches): run manifests record their values (hal/facts.py).
    environment_variables: ClassVar[tuple[str, ...]] = ()

    @classmethod
    @abstractmethod
    def is_available(cls) -> bool: ...

    @abstractmethod
    def device(self, rank: int = 0) -> torch.device: ...

    def use_device(self, index: int) -> None:
        """Make device `index` this process's current one (where allocations that name no
        device go, whose memory `mem_get_info` reports): a worker calls it first, with its
        own device (a second replica, a rank of another node). A no-op where a process has
        no current device."""
        return None

    @abstractmethod
    def synchronize(self) -> None: ...

    def device_count(self) -> int:
        """Devices this plugin can place ranks on (one worker rank per device, unless
        `Capabilities.devices_shared`)."""
        return 1

    @abstractmethod
    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes of the memory the KV arena is carved from."""

    def allocator_counters(self) -> dict[str, int]:
        """Running totals of the device allocator's expensive events (names of the plugin's
        choosing: reclaims after a failed allocation, calls into the driver), for the worker
        to say why a step took long to launch. Called rarely (not every step). None by
        default."""
        return {}

    def recent_compiles(self) -> list[str]:
        """The kernels this process compiled (or loaded into memory) since the last call, by
        name and specialization, oldest first: what the worker names when a launch was slow.
        None by default (a plugin without a just-in-time compiler)."""
        return []

    @abstractmethod
    def op(self, name: str) -> Callable[..., Any]:
        """The implementation of op `name`; raises an error naming the op, the plugin and the
        ops it registered if it has none (see hal/registry.py)."""

    def fused_op(self, name: str) -> Callable[..., Any] | None:
        """The plugin's implementation of fused op `name` (hal/ops.py FUSED_OP_NAMES), or None
        where it has none: the caller then composes the unfused ops that define it."""
        return None

    def linear_kernel(self, scheme: str) -> QuantLinearKernel:
        """The `linear` op for quantization scheme `scheme`. A plugin without quantized
        kernels raises MissingSchemeError (OpTablePlatform resolves its declared ones)."""
        from tessera.hal.errors import MissingSchemeError

        raise MissingSchemeError(scheme, self.name, native=(), fallbacks=())

    @abstractmethod
    def create_kv_arena(self, num_layers: int, num_slots: int, kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> KVArena: ...

    @abstractmethod
    def create_graph_runner(self) -> GraphRunner | None: ...

    @abstractmethod
    def create_communicator(self, rank: int, world_size: int, init_method: str,
                             loopback: bool = False,
                             device_index: int | None = None) -> Communicator:
        """`device_index`: the device this rank's tensors live on when it is not
        `device(rank)` (a second replica, a rank of another node); None: `device(rank)`.
        Callers pass it only when it differs, so a plugin may leave it out."""

    # --- streams, events, copies, profiling: defaults for a synchronous host-memory plugin ---
    def create_event(self) -> Event:
        return HostEvent()

    def pinned_empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A host buffer the device can copy to and from without the host waiting."""
        return torch.empty(shape, dtype=dtype)

    def host_to_device(self, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        """`host` (a host tensor the caller leaves alone afterwards) on `device`, queued behind
        the work already on the device without making the host wait for it."""
        return host.to(device)

    def host_to_device_many(self, hosts: list[torch.Tensor],
                            device: torch.device) -> list[torch.Tensor]:
        """Several host tensors on `device`, as host_to_device each (a step's inputs): a plugin
        whose copies cost a fixed price each may send them in one."""
        return [self.host_to_device(h, device) for h in hosts]

    def device_to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        """Start copying `tensor` into host memory, queued behind the work that produces it.
        Its values are there once an event recorded after this call has completed."""
        return tensor.to("cpu")

    def profile_range(self, name: str) -> contextlib.AbstractContextManager[None]:
        """A named range for the chip's profiler around a phase of a step; a no-op where the
        chip has none."""
        return _NO_RANGE

    def start_profile(self) -> StepProfile:
        """Start profiling this process's work (--profile-dir): the host's ops here; a plugin
        whose device has a profiler torch.profiler reads adds its activity."""
        from torch.profiler import ProfilerActivity

        return StepProfile([ProfilerActivity.CPU], self.synchronize)


_NO_RANGE = contextlib.nullcontext()


class StepProfile:
    """A running profile of this process's work (Platform.start_profile): torch.profiler
    with the given activities. `stop(prefix)` ends it and writes PREFIX.trace.json (Chrome
    trace format: chrome://tracing, Perfetto) and PREFIX.kernels.json (the time of each op and
    kernel, device time first), and returns the latter's content."""

    def __init__(self, activities: list[Any], synchronize: Callable[[], None]) -> None:
        from torch.profiler import profile

        self._synchronize = synchronize
        self._synchronize()  # earlier work stays out of the window
        self._prof = profile(activities=activities)
        self._prof.__enter__()
        self._start = _monotonic()

    def stop(self, prefix: str, **facts: Any) -> dict[str, Any]:
        import json

        self._synchronize()
        wall_s = _monotonic() - self._start
        self._prof.__exit__(None, None, None)
        self._prof.export_chrome_trace(prefix + ".trace.json")
        rows = []
        for evt in self._prof.key_averages():
            device_us = float(getattr(evt, "self_device_time_total",
                                      getattr(evt, "self_cuda_time_total", 0.0)) or 0.0)
            rows.append({"name": evt.key, "count": int(evt.count),
                         "self_device_us": round(device_us, 2),
                         "self_host_us": round(float(evt.self_cpu_time_total), 2)})
        rows.sort(key=lambda r: (-r["self_device_us"], -r["self_host_us"]))
        summary = {"wall_s": wall_s,
                   "device_us": round(sum(r["self_device_us"] for r in rows), 2),
                   **facts, "ops": rows}
        with open(prefix + ".kernels.json", "w") as f:
            json.dump(summary, f, indent=1)
        return summary


def _monotonic() -> float:
    import time

    return time.perf_counter()
