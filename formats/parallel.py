"""Whether a model can be split over --tp-size x --pp-size (x --ep-size) ranks, and how its
layers fall into pipeline stages.

Read by the launcher before anything starts (so an impossible split is refused at once, naming
the flag to change) and by every worker when it builds its share of the model.

    problems = split_problems(config, tp_size=2, pp_size=2)   # [] when the split works
    stage = StageLayers.of(config.num_layers, pp_size=2, stage=1)   # layers [16, 32)
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.formats.config import ModelConfig

_MAX_SUGGESTED = 64


@dataclass(frozen=True)
class StageLayers:
    """The decoder layers [first, end) of one pipeline stage (equal stages, in order)."""

    stage: int
    size: int  # number of stages
    first: int
    end: int

    @classmethod
    def of(cls, num_layers: int, pp_size: int, stage: int) -> StageLayers:
        if pp_size < 1 or not 0 <= stage < pp_size:
            raise ValueError(f"bad pipeline stage {stage} of {pp_size}")
        if num_layers % pp_size:
            raise ValueError(layers_problem(num_layers, pp_size))
        per = num_layers // pp_size
        return cls(stage=stage, size=pp_size, first=stage * per, end=(stage + 1) * per)

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.size - 1

    @property
    def layers(self) -> range:
        return range(self.first, self.end)

    def __contains__(self, layer: int) -> bool:
        return self.first <= layer < self.end


def _tp_problems(config: ModelConfig, size: int, ep_size: int) -> list[str]:
    """What --tp-size `size` does not divide (empty: it divides everything it must)."""
    problems = []
    if config.num_heads % size:
        problems.append(f"num_attention_heads ({config.num_heads})")
    moe = config.moe
    if (moe is None or moe.dense_layers) and config.intermediate_size % size:
        problems.append(f"intermediate_size ({config.intermediate_size})")
    kv = config.num_kv_heads
    # More ranks than KV heads: each KV head is replicated on size / kv ranks.
    if (kv % size) if kv >= size else (size % kv):
        problems.append(f"num_key_value_heads ({kv})")
    if moe is not None and ep_size >= 1 and size % ep_size == 0:
        moe_tp = size // ep_size
        if moe.intermediate_size % moe_tp:
            problems.append(f"the expert intermediate size ({moe.intermediate_size}) by "
                            f"tp/ep = {moe_tp}")
        if moe.num_experts % ep_size:
            problems.append(f"the number of experts ({moe.num_experts}) by ep {ep_size}")
        if moe.shared_intermediate_size % size:
            problems.append(f"the shared expert size ({moe.shared_intermediate_size})")
    return problems


def tp_sizes_that_work(config: ModelConfig, ep_size: int = 1) -> list[int]:
    """The tensor-parallel sizes (up to 64) this model can be split into."""
    return [t for t in range(1, _MAX_SUGGESTED + 1)
            if t % ep_size == 0 and not _tp_problems(config, t, ep_size)]


def tp_problem(config: ModelConfig, tp_size: int, ep_size: int = 1) -> str | None:
    """Why --tp-size (with --ep-size) cannot split this model, or None."""
    if tp_size < 1:
        return f"--tp-size must be at least 1, got {tp_size}"
    if ep_size < 1 or tp_size % ep_size:
        return f"--ep-size {ep_size} must divide --tp-size {tp_size}"
    if ep_size > 1 and config.moe is None:
        return (f"--ep-size {ep_size} needs a Mixture-of-Experts model; {config.arch} has no "
                f"experts")
    problems = _tp_problems(config, tp_size, ep_size)
    if not problems:
        return None
    ep = f" (--ep-size {ep_size})" if ep_size > 1 else ""
    return (f"--tp-size {tp_size}{ep} does not divide {', '.join(problems)} of this model; "
            f"choose a --tp-size that divides them: "
            f"{', '.join(map(str, tp_sizes_that_work(config, ep_size)))}")


def layers_problem(num_layers: int, pp_size: int) -> str:
    fits = [p for p in range(1, min(num_layers, _MAX_SUGGESTED) + 1) if num_layers % p == 0]
    return (f"--pp-size {pp_size} does not divide num_hidden_layers ({num_layers}) into equal "
            f"stages; choose a --pp-size that divides it: {', '.join(map(str, fits))}")


def pp_problem(config: ModelConfig, pp_size: int) -> str | None:
    """Why --pp-size cannot split this model's layers, or None."""
    if pp_size < 1:
        return f"--pp-size must be at least 1, got {pp_size}"
    if config.num_layers % pp_size:
        return layers_problem(config.num_layers, pp_size)
    return None


def split_problems(config: ModelConfig, tp_size: int, pp_size: int,
                   ep_size: int = 1) -> list[str]:
    """Every reason the split cannot work (empty when it can)."""
    return [p for p in (tp_problem(config, tp_size, ep_size), pp_problem(config, pp_size)) if p]


def devices_problem(world_size: int, tp_size: int, pp_size: int, devices: int,
                    plugin: str) -> str | None:
    """One worker per device: more ranks than devices cannot be placed."""
    if world_size <= devices:
        return None
    return (f"--tp-size {tp_size} x --pp-size {pp_size} = {world_size} worker ranks, but the "
            f"{plugin} plugin sees {devices} device(s); lower --tp-size or --pp-size (or make "
            f"more devices visible)")
