"""What a step costs on this device, learned from the steps it runs, and how many prefill
tokens the next step may therefore carry.

A step of D decodes and P prefill tokens takes about decode_ms(D) + P * prefill_ms_per_token:
decode-only steps measure `decode_ms` (the step every running stream waits for), per size of
batch (powers of two: a decode step of 128 streams reads more KV than one of 8), and steps
with at least MIN_PREFILL_MEASURED prefill tokens measure the marginal cost of a prefill token
over the decode step of their own batch size (a step whose size has no decode-only step
measured yet teaches nothing, once a first estimate exists). All are moving
averages of the worker's own time per step (`forward_ms`). Charging a mixed step's decodes
at the last decode step's cost instead (whatever its batch size, or nothing before the first
one) made prefill tokens look 3x dearer than they are on an H200 (0.067 ms against 0.019)
whenever prompts kept arriving, so decode-only steps were few: the chunks were cut to the
floor.

The prefill budget protects running decodes: while some decode, a step that also prefills
may take at most `max_mixed_step_ratio` decode steps, so its chunk is what fits in the rest
at the measured cost, but never less than `min_tokens` (new requests must still be served:
protecting decodes must not starve arrivals). Independently, `step_target_ms` caps the
prefill work of every step: a request that arrives while a long prompt prefills waits for the
step in flight, so on a slow CPU device no step may last tens of seconds, even one that had
nobody to wait for it when it started. That cap stops at `min_tokens` too: on a device whose
fixed cost per step is near the target, smaller chunks would make the prompt take hundreds
of steps, and before a decode step has measured that fixed cost it counts as prefill work,
so each smaller chunk would measure dearer and shrink the next (down to a page a step, a
long prompt took minutes and the requests waiting beside it got no budget). Before anything
is measured (a fresh or restarted engine), a step prefills at most UNMEASURED_CHUNK tokens:
enough to measure the device, little enough not to hold an arrival for long.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MIN_PREFILL_MEASURED = 32  # smaller chunks measure the fixed cost of a step, not a token
SMOOTHING = 0.3  # weight of the newest step in the moving averages
UNMEASURED_CHUNK = 512  # prefill tokens a step may carry before the device is measured


def _tokens(ms: float, per_token_ms: float) -> int:
    return int(round(ms / per_token_ms, 6))  # 299.99999999 tokens of float noise are 300


def _ema(old: float, new: float) -> float:
    return new if old <= 0 else (1 - SMOOTHING) * old + SMOOTHING * new


def batch_class(decodes: int) -> int:
    """Decode counts measured together: 1, 2-3, 4-7, ..., 128-255, 256-511."""
    return max(1, decodes).bit_length()


@dataclass
class StepCost:
    decode_ms: float = 0.0  # the latest decode-only steps, moving average (0: none seen yet)
    prefill_ms_per_token: float = 0.0  # marginal cost of a prefill token (0: unknown)
    # decode-only steps by batch_class of their decode count, moving averages
    decode_ms_by_class: dict[int, float] = field(default_factory=dict)

    def decode_ms_at(self, decodes: int) -> float:
        """The decode step of this many streams: its class's, else the nearest class
        measured (the smaller on a tie), else 0 (nothing measured)."""
        if not self.decode_ms_by_class:
            return 0.0
        want = batch_class(decodes)
        nearest = min(self.decode_ms_by_class, key=lambda c: (abs(c - want), c))
        return self.decode_ms_by_class[nearest]

    def observe(self, decodes: int, prefill_tokens: int, step_ms: float) -> None:
        """Learn from one finished step (its decode count, prefill tokens, own time)."""
        if step_ms <= 0:
            return
        if prefill_tokens == 0:
            if decodes:
                self.decode_ms = _ema(self.decode_ms, step_ms)
                c = batch_class(decodes)
                self.decode_ms_by_class[c] = _ema(self.decode_ms_by_class.get(c, 0.0), step_ms)
            return
        if prefill_tokens < MIN_PREFILL_MEASURED:
            return
        # The step's decodes cost what a decode step of their batch size costs; a step
        # without decodes still reads every weight once, as a one-stream decode step does
        # (that one exactly: a step of 128 streams, the nearest measured maybe, reads KV
        # besides and would leave the prefill tokens too little). With nothing to charge yet,
        # the whole step goes to its prefill tokens: an overestimate (smaller chunks) until a
        # decode step corrects it.
        if decodes:
            own = self.decode_ms_by_class.get(batch_class(decodes))
            if own is None and self.prefill_ms_per_token > 0:
                # Its decodes' cost is unknown (no decode-only step of its batch size yet):
                # charged a smaller batch's step, as the nearest measured often is, its
                # prefill tokens take the rest of the KV reads. B2 on an H200 (prompts beside
                # ever more decodes, few decode-only steps) learned 0.060 ms a token where a
                # prefill step measures 0.019. Teach nothing rather than that.
                return
            base = own if own is not None else self.decode_ms_at(decodes)  # first guess
        else:
            base = self.decode_ms_by_class.get(batch_class(1), 0.0)
        marginal = (step_ms - base) / prefill_tokens
        if marginal > 0:
            self.prefill_ms_per_token = _ema(self.prefill_ms_per_token, marginal)

    def prefill_budget(self, *, decodes: int, cap: int, min_tokens: int, floor: int,
                       max_mixed_step_ratio: float, step_target_ms: float) -> int:
        """Prefill tokens the next step may carry: at most `cap`; while `decodes` streams
        decode, what fits in (max_mixed_step_ratio - 1) of their decode steps, and at most
        step_target_ms of prefill work, but at least `min_tokens` (UNMEASURED_CHUNK before
        any measure). A step target of 0 turns the time cap off."""
        per_token = self.prefill_ms_per_token
        if per_token <= 0:
            return min(cap, UNMEASURED_CHUNK) if step_target_ms > 0 else cap
        budget = cap
        decode_ms = self.decode_ms_at(decodes)
        if decodes and max_mixed_step_ratio > 1 and decode_ms > 0:
            fits = _tokens((max_mixed_step_ratio - 1) * decode_ms, per_token)
            budget = min(budget, max(fits, min_tokens))
        if step_target_ms > 0:
            budget = min(budget, max(_tokens(step_target_ms, per_token), min_tokens))
        return max(budget, min(floor, cap))
