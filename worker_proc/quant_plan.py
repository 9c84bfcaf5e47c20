"""Which linear weights run quantized, in which scheme: --quantization against the checkpoint
and the plugin.

    auto      a quantized checkpoint (GGUF blocks, AWQ, GPTQ, fp8) keeps its weights
              quantized; a floating-point one stays floating point
    none      everything dequantized at load to the serving dtype (any plugin runs it)
    fp8|int8|int4
              floating-point linear weights are quantized at load (the LM head only with
              --quantize-lm-head: by default it stays dense, as is usual); a checkpoint quantized in another scheme is dequantized first, then
              requantized (logged); one already in the scheme is kept as it is

The plugin must run every scheme the plan uses (natively or through its declared reference
fallback): otherwise start-up fails with MissingSchemeError, which says to use
--quantization none.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from tessera.config import SCHEMES_AT_LOAD
from tessera.formats import ModelFiles
from tessera.hal.platform import Platform, QuantLinearKernel

log = logging.getLogger(__name__)


@dataclass
class QuantPlan:
    keep_checkpoint: bool  # iter_tensors(keep_quantized=...)
    quantize_to: str | None  # scheme for floating-point linear weights (not the LM head)
    platform: Platform | None = None
    lm_head: str | None = None  # scheme of a floating-point LM head (--quantize-lm-head)
    _kernels: dict[str, QuantLinearKernel] = field(default_factory=dict, repr=False)

    @property
    def active(self) -> bool:
        return self.keep_checkpoint or self.quantize_to is not None or self.lm_head is not None

    def kernel(self, scheme: str) -> QuantLinearKernel:
        """The plugin's linear for `scheme`, resolved once."""
        kernel = self._kernels.get(scheme)
        if kernel is None:
            assert self.platform is not None
            kernel = self._kernels[scheme] = self.platform.linear_kernel(scheme)
        return kernel

    def describe(self) -> str:
        if not self.active:
            return "weights in floating point"
        parts = []
        if self.keep_checkpoint:
            parts.append("checkpoint's quantized weights kept")
        if self.quantize_to:
            parts.append(f"linear weights quantized to {self.quantize_to} at load")
        if self.lm_head:
            parts.append(f"LM head quantized to {self.lm_head} at load")
        return ", ".join(parts)


def plan_quantization(requested: str, files: ModelFiles, platform: Platform, *,
                      lm_head: bool = False) -> QuantPlan:
    """`lm_head`: --quantize-lm-head, which needs a scheme quantized at load (fp8, int8, int4;
    EngineConfig refuses it otherwise)."""
    if lm_head and requested not in SCHEMES_AT_LOAD:
        raise ValueError(f"--quantize-lm-head needs --quantization fp8, int8 or int4, got "
                         f"{requested}")
    checkpoint = files.quant_schemes()
    if requested == "none":
        return QuantPlan(False, None, platform)
    if requested == "auto":
        plan = QuantPlan(bool(checkpoint), None, platform)
    elif checkpoint and checkpoint != {requested}:
        log.info("--quantization %s: the checkpoint is %s; its weights are dequantized and "
                 "requantized to %s", requested, files.quantization, requested)
        plan = QuantPlan(False, requested, platform)
    else:
        plan = QuantPlan(bool(checkpoint), None if checkpoint else requested, platform)
    if lm_head:
        # A floating-point head is quantized to the requested scheme, also where the
        # checkpoint's own weights are kept in it (a head the checkpoint quantized is kept).
        plan.lm_head = requested
    schemes = (checkpoint if plan.keep_checkpoint else set()) | {
        s for s in (plan.quantize_to, plan.lm_head) if s}
    for scheme in sorted(schemes):
        plan.kernel(scheme)  # a scheme the plugin cannot run fails here, with advice
    return plan
