"""The reference ops: the cpu plugin's plain-PyTorch implementations, device-generic.

They are the oracle of the conformance suite and the target of a plugin's declared
`reference_fallbacks`. Imported lazily so that `import tessera.hal` stays cheap.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from tessera.hal.ops import FUSED_OP_NAMES, OP_NAMES

# op name -> "module:function"
REFERENCE_TARGETS: dict[str, str] = {
    "embedding": "tessera.hal.cpu.dense:embedding",
    "rms_norm": "tessera.hal.cpu.dense:rms_norm",
    "fused_add_rms_norm": "tessera.hal.cpu.dense:fused_add_rms_norm",
    "rotary_embedding": "tessera.hal.cpu.dense:rotary_embedding",
    "silu_and_mul": "tessera.hal.cpu.dense:silu_and_mul",
    "gelu_tanh_and_mul": "tessera.hal.cpu.dense:gelu_tanh_and_mul",
    "linear": "tessera.hal.cpu.dense:linear",
    "store_kv": "tessera.hal.cpu.dense:store_kv",
    "attention_extend": "tessera.hal.cpu.attention:attention_extend",
    "attention_decode": "tessera.hal.cpu.attention:attention_decode",
    "fused_moe": "tessera.hal.cpu.moe:fused_moe",
    "sample": "tessera.hal.cpu.sampling:sample",
    "apply_token_mask": "tessera.hal.cpu.token_mask:apply_token_mask",
    # fused ops: the compositions of the ops above that define them
    "rotary_store_kv": "tessera.hal.cpu.dense:rotary_store_kv",
    "silu_and_mul_linear": "tessera.hal.cpu.dense:silu_and_mul_linear",
    "moe_softmax_topk": "tessera.hal.cpu.moe:moe_softmax_topk",
}
assert set(REFERENCE_TARGETS) == set(OP_NAMES) | set(FUSED_OP_NAMES), "every op needs a reference"


def reference_op(name: str) -> Callable[..., Any]:
    target = REFERENCE_TARGETS.get(name)
    if target is None:
        raise KeyError(f"no reference op {name!r}; the op names are "
                       f"{list(OP_NAMES) + list(FUSED_OP_NAMES)}")
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)  # type: ignore[no-any-return]


def reference_ops() -> dict[str, Callable[..., Any]]:
    """Every op and every fused op."""
    return {name: reference_op(name) for name in (*OP_NAMES, *FUSED_OP_NAMES)}
