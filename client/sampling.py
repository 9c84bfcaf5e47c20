"""The one check of a request's sampling parameters in a client process.

`check_sampling` builds SamplingParams from what the caller gave (an object, a dict and/or
keyword overrides) and runs `SamplingParams.validate` on them; a bad value is a
BadRequestError naming the field. What it returns is a `CheckedSampling`: `generate`/`start`
send those parameters as they are. A caller that must read the parameters before it starts a
request (the HTTP server reads `n` to lay out its choices, and starts one engine request per
prompt of a list) checks once and passes the CheckedSampling on, so the check runs once per
request in that process. The tokenizer checks again on its side: any bus client may send a
GenerateRequest, so it cannot trust one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tessera.bus.messages import SamplingParams
from tessera.client.errors import BadRequestError


@dataclass(frozen=True)
class CheckedSampling:
    """SamplingParams that `check_sampling` accepted. Make one only through it."""

    params: SamplingParams


SamplingArg = SamplingParams | CheckedSampling | dict[str, Any] | None


def check_sampling(sampling: SamplingArg, overrides: dict[str, Any]) -> CheckedSampling:
    """SamplingParams from an object, a dict and/or keyword overrides; invalid -> 400.
    Already checked parameters without overrides are taken as they are."""
    if isinstance(sampling, CheckedSampling):
        if not overrides:
            return sampling
        values: dict[str, Any] = sampling.params.to_dict()
    elif sampling is None:
        values = {}
    elif isinstance(sampling, SamplingParams):
        values = sampling.to_dict()
    elif isinstance(sampling, dict):
        values = dict(sampling)
    else:
        raise BadRequestError(f"sampling must be SamplingParams or a dict, got "
                              f"{type(sampling).__name__}", param="sampling")
    values.update(overrides)
    try:
        params = SamplingParams.from_dict(values)
    except (TypeError, ValueError) as exc:
        raise BadRequestError(f"{exc}; see SamplingParams for the accepted names") from None
    problem = params.validate()
    if problem:
        raise BadRequestError(problem.message, param=problem.param)
    return CheckedSampling(params)
