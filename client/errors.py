"""Typed errors of the client library, each carrying the HTTP status the server answers with.

The engine reports failures as `ErrorReply(status, message, error_type, param)`; `from_reply`
turns one into the matching exception so that a Python caller and an HTTP caller see the
same classes of failure: 400 bad input, 404 unknown model, 413 prompt too long, 429 rate
limited, 503 overloaded / unavailable (with a retry hint), 504 no progress in time.
"""

from __future__ import annotations

from tessera.bus.messages import ErrorReply


class TesseraError(Exception):
    """Base of every error the client raises. `status` follows HTTP."""

    status = 500
    error_type = "internal_error"

    def __init__(self, message: str, *, status: int | None = None,
                 error_type: str | None = None, param: str | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if error_type is not None:
            self.error_type = error_type
        self.param = param
        self.retry_after = retry_after


class BadRequestError(TesseraError):
    status = 400
    error_type = "invalid_request_error"


class AuthenticationError(TesseraError):
    status = 401
    error_type = "invalid_request_error"


class NotFoundError(TesseraError):
    status = 404
    error_type = "invalid_request_error"


class PromptTooLongError(BadRequestError):
    status = 413


class RateLimitError(TesseraError):
    status = 429
    error_type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after: float | None = 1.0, **kw: object) -> None:
        super().__init__(message, retry_after=retry_after, **kw)  # type: ignore[arg-type]


class UnavailableError(TesseraError):
    """The engine cannot take requests now (503); `retry_after` says when to try again."""

    status = 503
    error_type = "service_unavailable"

    def __init__(self, message: str, *, retry_after: float | None = 1.0, **kw: object) -> None:
        super().__init__(message, retry_after=retry_after, **kw)  # type: ignore[arg-type]


class OverloadedError(UnavailableError):
    """Queues are full or the circuit breaker is open: back off and retry."""

    error_type = "overloaded_error"


class EngineDeadError(UnavailableError):
    """An engine process died; requests in flight are lost and the engine is stopping."""

    error_type = "engine_dead"


class SlowConsumerError(UnavailableError):
    """The caller stopped reading a stream: its request was aborted rather than buffered."""

    error_type = "slow_consumer"


class EngineNotFoundError(UnavailableError):
    """No engine runs at the run directory the client was given."""

    error_type = "engine_not_found"


class RequestTimeoutError(TesseraError):
    """The engine made no progress on the request within the configured time."""

    status = 504
    error_type = "timeout_error"


class InternalError(TesseraError):
    status = 500
    error_type = "internal_error"


_BY_STATUS: dict[int, type[TesseraError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    404: NotFoundError,
    413: PromptTooLongError,
    429: RateLimitError,
    500: InternalError,
    503: OverloadedError,
    504: RequestTimeoutError,
}


def from_reply(reply: ErrorReply) -> TesseraError:
    """The exception matching an engine's ErrorReply (unknown statuses keep their number)."""
    cls = _BY_STATUS.get(reply.status, TesseraError)
    if cls is TesseraError:
        return TesseraError(reply.message, status=reply.status, error_type=reply.error_type,
                            param=reply.param)
    return cls(reply.message, error_type=reply.error_type, param=reply.param)
