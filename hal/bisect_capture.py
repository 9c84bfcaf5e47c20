"""`tessera doctor --bisect-capture`: which op of a step breaks under graph capture.

When start-up fails in graph capture (T106 in docs/troubleshooting.md), or output differs with
graphs on and off, the whole model's step is too big to look at. This runs each op of a step
alone on small inputs, as the worker does: once eagerly (warm-up), then captured, then the
inputs are overwritten in their buffers and the graph replayed; the replay must equal the
eager op on the new inputs. The first op that fails to capture, or replays something else, is
the one to look at (with `--disable-graph-capture` serving meanwhile).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tessera.hal.conformance_data import make_paged_case, sampling_params


@dataclass(frozen=True)
class OpCapture:
    op: str
    ok: bool
    detail: str


@dataclass
class OpCase:
    """One op on fixed input buffers: `run()` calls it; `inputs` are the buffers a step
    overwrites before a replay (new values, the same memory, as a captured graph requires);
    `result(out)` the tensor(s) to compare (in-place ops: the buffers they write)."""

    name: str
    run: Callable[[], Any]
    inputs: tuple[torch.Tensor, ...]
    result: Callable[[Any], torch.Tensor]

    def refill(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        for b in self.inputs:
            if b.dtype.is_floating_point:
                b.copy_(torch.randn(b.shape, generator=g).to(b.dtype))
            else:
                b.copy_(torch.randint(0, 8, b.shape, generator=g).to(b.dtype))


def _flat(out: Any) -> torch.Tensor:
    if isinstance(out, tuple | list):
        return torch.cat([t.float().reshape(-1) for t in out])
    return out.float().reshape(-1)


def op_cases(op: Callable[[str], Callable[..., Any]], device: torch.device,
             dtype: torch.dtype) -> list[OpCase]:
    """The ops of a decoder step, in the order a step runs them."""
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)

    def refill(*bufs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return bufs

    cases: list[OpCase] = []
    ids = torch.randint(0, 64, (8,), generator=gen).to(device)
    table = rand(64, 64)
    cases.append(OpCase("embedding", lambda: op("embedding")(ids, table), refill(ids), _flat))
    x, res, w = rand(8, 64), rand(8, 64), rand(64)
    cases.append(OpCase("rms_norm", lambda: op("rms_norm")(x, w, 1e-6), refill(x), _flat))
    cases.append(OpCase("fused_add_rms_norm",
                        lambda: op("fused_add_rms_norm")(x, res, w, 1e-6), refill(x, res),
                        _flat))
    pos = torch.arange(8, device=device)
    q, k, cos_sin = rand(8, 4, 32), rand(8, 2, 32), rand(64, 32)
    cases.append(OpCase("rotary_embedding",
                        lambda: op("rotary_embedding")(pos, q, k, cos_sin), refill(pos, q, k),
                        _flat))
    gate_up = rand(8, 128)
    cases.append(OpCase("silu_and_mul", lambda: op("silu_and_mul")(gate_up), refill(gate_up),
                        _flat))
    weight = rand(32, 64)
    cases.append(OpCase("linear", lambda: op("linear")(x, weight, None), refill(x), _flat))
    k_cache, v_cache = rand(64, 2, 32), rand(64, 2, 32)
    new_k, new_v = rand(4, 2, 32), rand(4, 2, 32)
    slots = torch.tensor([3, 9, 17, 40], device=device)
    cases.append(OpCase("store_kv",
                        lambda: op("store_kv")(k_cache, v_cache, new_k, new_v, slots),
                        refill(new_k, new_v), lambda _: _flat((k_cache, v_cache))))
    dec = make_paged_case((5, 9, 16), (1, 1, 1), 8, 2, 64, dtype, seed=25).to(device)
    cases.append(OpCase("attention_decode",
                        lambda: op("attention_decode")(dec.q, dec.k_cache, dec.v_cache,
                                                       dec.req_to_token, dec.seq_lens,
                                                       dec.scale), refill(dec.q), _flat))
    ext = make_paged_case((8, 13, 12), (3, 1, 4), 8, 2, 64, dtype, seed=19).to(device)
    cases.append(OpCase("attention_extend",
                        lambda: op("attention_extend")(ext.q, ext.k_cache, ext.v_cache,
                                                       ext.req_to_token, ext.seq_lens,
                                                       ext.extend_lens, ext.qo_indptr,
                                                       ext.scale, 4), refill(ext.q), _flat))
    logits = torch.randn((4, 64), generator=gen).to(device)
    greedy = sampling_params(4, device, temperature=0.0)
    cases.append(OpCase("sample", lambda: op("sample")(logits, greedy), refill(logits), _flat))
    return cases


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> str | None:
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)} after replay, {tuple(want.shape)} eagerly"
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    if torch.allclose(got, want, atol=tol, rtol=tol):
        return None
    return f"replay differs from the eager op by up to {(got - want).abs().max().item():.3g}"


def bisect_capture(platform: Any, stop_at_first: bool = False) -> list[OpCapture]:
    """Each op of a step captured alone and replayed on new inputs (see the module doc)."""
    runner = platform.create_graph_runner()
    if runner is None:
        raise ValueError(f"plugin {platform.name!r} captures no graphs: nothing to bisect")
    dtype = getattr(torch, platform.capabilities.default_dtype)
    device = platform.device()
    results: list[OpCapture] = []
    for key, case in enumerate(op_cases(platform.op, device, dtype)):
        try:
            case.run()  # warm-up outside capture: lazy compilation, workspaces
            platform.synchronize()
        except Exception as exc:
            results.append(OpCapture(case.name, False, f"fails even eagerly: {exc!r}"))
            continue
        try:
            runner.begin_capture(key)
            out = case.run()
            runner.end_capture(key)
        except Exception as exc:
            results.append(OpCapture(case.name, False, f"capture raised {exc!r}"))
            runner.reset()
        else:
            case.refill(1000 + key)
            before = [b.clone() for b in case.inputs]  # an op may write its inputs in place
            runner.replay(key)
            platform.synchronize()
            got = case.result(out).clone()
            for buf, saved in zip(case.inputs, before, strict=True):
                buf.copy_(saved)
            want = case.result(case.run())
            problem = _close(got, want, dtype)
            results.append(OpCapture(case.name, problem is None,
                                     problem or "captures and replays like the eager op"))
        if stop_at_first and not results[-1].ok:
            break
    runner.reset()
    return results
