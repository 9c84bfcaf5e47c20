"""The kernel-compile counter the worker's slow-launch report reads (needs Triton, no GPU)."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")


def test_compiles_are_counted_named_and_the_previous_hook_still_runs(monkeypatch) -> None:
    from triton import knobs

    from tessera.hal.cuda import compile_watch

    if not hasattr(knobs.runtime, "jit_post_compile_hook"):
        pytest.skip("this Triton has no post-compile hook")
    seen: list[str] = []
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook",
                        lambda **kw: seen.append(kw["repr"]))
    monkeypatch.setattr(compile_watch, "_installed", False)
    assert compile_watch.install() and compile_watch.install()  # idempotent: one hook
    compile_watch.take_recent()
    before = compile_watch.compiles()
    # what Triton's JIT calls once per kernel it puts into its in-memory cache
    knobs.runtime.jit_post_compile_hook(key="k1", repr="_stage1[num_warps=4](n: i32)",
                                        fn=None, compile={}, is_manual_warmup=False,
                                        already_compiled=False)
    knobs.runtime.jit_post_compile_hook(key="k2", repr="_merge[num_warps=1](n: i32)",
                                        fn=None, compile={}, is_manual_warmup=False,
                                        already_compiled=False)
    assert compile_watch.compiles() == before + 2
    assert compile_watch.take_recent() == ["_stage1[num_warps=4](n: i32)",
                                           "_merge[num_warps=1](n: i32)"]
    assert compile_watch.take_recent() == []
    assert seen == ["_stage1[num_warps=4](n: i32)", "_merge[num_warps=1](n: i32)"]
