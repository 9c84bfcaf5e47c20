"""Per-key rate limits: requests and tokens per minute, as token buckets.

A key's request bucket holds `rpm` requests and refills at rpm / 60 per second; each
generation takes one. Its token bucket holds `tpm` tokens, refills at tpm / 60 per second,
and is charged the request's real usage (prompt + completion tokens) when it ends, so it can
go into debt; a new request is admitted only while the bucket is not in debt. Either limit
answers 429 with Retry-After: the seconds until the bucket allows the next request.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from tessera.server.errors import ApiError
from tessera.server.keys import ApiKey


@dataclass
class Bucket:
    capacity: float
    per_second: float
    level: float
    at: float

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.at) * self.per_second)
        self.at = now

    def wait_for(self, amount: float) -> float:
        """Seconds until the level reaches `amount`."""
        return max(0.0, (amount - self.level) / self.per_second)


class RateLimiter:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._requests: dict[str, Bucket] = {}
        self._tokens: dict[str, Bucket] = {}

    def _bucket(self, table: dict[str, Bucket], name: str, per_minute: int,
                now: float) -> Bucket:
        bucket = table.get(name)
        if bucket is None:
            bucket = table[name] = Bucket(per_minute, per_minute / 60.0, per_minute, now)
        bucket.refill(now)
        return bucket

    def admit(self, key: ApiKey) -> None:
        """Take one request of the key's allowance, or raise ApiError 429 (Retry-After)."""
        now = self._clock()
        requests = self._bucket(self._requests, key.name, key.rpm, now) if key.rpm else None
        tokens = self._bucket(self._tokens, key.name, key.tpm, now) if key.tpm else None
        if requests is not None and requests.level < 1.0:
            self._refuse(key, f"{key.rpm} requests per minute", requests.wait_for(1.0))
        if tokens is not None and tokens.level <= 0.0:
            self._refuse(key, f"{key.tpm} tokens per minute", tokens.wait_for(1.0))
        if requests is not None:
            requests.level -= 1.0

    def charge(self, key: ApiKey, tokens: int) -> None:
        """Count a finished request's prompt and completion tokens against the key."""
        if key.tpm and tokens > 0:
            bucket = self._bucket(self._tokens, key.name, key.tpm, self._clock())
            bucket.level -= tokens

    def _refuse(self, key: ApiKey, limit: str, wait_s: float) -> None:
        retry = max(1, math.ceil(wait_s))
        raise ApiError(429, f"the API key {key.name!r} is over its limit of {limit}; retry in "
                            f"{retry} s", retry_after=retry)
