"""Graph capture for a chip that runs PyTorch eagerly: record the aten ops a capture runs
(with the very tensors they read and wrote) and replay the tape on the current contents of
those tensors. Like a device graph, it fixes every address at capture and cannot capture
work that reads a device value on the host."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from tessera.hal.platform import GraphRunner

Tape = list[tuple[Any, tuple[Any, ...], dict[str, Any], Any]]

# A host read of a device value inside a capture would be frozen into the graph.
_HOST_READS = {torch.ops.aten._local_scalar_dense.default}


class _Recorder(TorchDispatchMode):
    def __init__(self, tape: Tape) -> None:
        super().__init__()
        self.tape = tape

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _HOST_READS:
            raise RuntimeError(f"{func} reads a device value on the host: it cannot be "
                               f"captured")
        out = func(*args, **kwargs)
        self.tape.append((func, args, kwargs, out))
        return out


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


class RecordingGraphRunner(GraphRunner):
    def __init__(self) -> None:
        self.tapes: dict[Any, Tape] = {}
        self._active: tuple[Any, _Recorder] | None = None

    def begin_capture(self, key: Any) -> None:
        if self._active is not None:
            raise RuntimeError(f"begin_capture({key!r}) while capturing {self._active[0]!r}")
        if key in self.tapes:
            raise ValueError(f"a graph for {key!r} is already captured; reset() first")
        recorder = _Recorder([])
        recorder.__enter__()
        self._active = (key, recorder)

    def end_capture(self, key: Any) -> None:
        if self._active is None or self._active[0] != key:
            raise RuntimeError(f"end_capture({key!r}) without a matching begin_capture")
        _, recorder = self._active
        self._active = None
        recorder.__exit__(None, None, None)
        self.tapes[key] = recorder.tape

    def replay(self, key: Any) -> None:
        tape = self.tapes.get(key)
        if tape is None:
            raise KeyError(f"no graph captured for {key!r}")
        with torch.inference_mode():
            for func, args, kwargs, out in tape:
                fresh = func(*args, **kwargs)
                # In-place ops and views write or alias memory the tape already holds; an op
                # that allocated its result at capture has it rewritten where it was.
                for old, new in zip(tree_flatten(out)[0], tree_flatten(fresh)[0], strict=True):
                    if isinstance(old, torch.Tensor) and not _same_memory(old, new):
                        old.copy_(new)

    def reset(self) -> None:
        if self._active is not None:
            raise RuntimeError("reset() during a capture")
        self.tapes.clear()
