"""OpenAI's error JSON, and the mapping from client-library errors to HTTP statuses.

    {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature",
               "code": null}}

503 and 429 answers carry `Retry-After` (whole seconds, at least 1).
"""

from __future__ import annotations

import math
from typing import Any

from aiohttp import web

from tessera.client.errors import TesseraError

_CODES = {401: "invalid_api_key", 404: "model_not_found", 413: "context_length_exceeded",
          429: "rate_limit_exceeded"}
_TYPES = {400: "invalid_request_error", 401: "invalid_request_error",
          404: "invalid_request_error", 405: "invalid_request_error",
          413: "invalid_request_error", 429: "rate_limit_error", 500: "internal_error",
          503: "service_unavailable", 504: "timeout_error"}


class ApiError(Exception):
    """An error answered to the HTTP caller; raise it anywhere in a handler."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 error_type: str | None = None, code: str | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.error_type = error_type or _TYPES.get(status, "invalid_request_error")
        self.code = code if code is not None else _CODES.get(status)
        self.retry_after = retry_after
        if retry_after is None and status in (429, 503):
            self.retry_after = 1.0

    @classmethod
    def from_client(cls, exc: TesseraError) -> ApiError:
        if exc.status == 413:
            # A prompt (plus max_tokens) longer than the context: OpenAI answers 400 with
            # this code, and clients look for it.
            return cls(400, exc.message, param=exc.param, error_type="invalid_request_error",
                       code="context_length_exceeded")
        return cls(exc.status, exc.message, param=exc.param, error_type=exc.error_type,
                   retry_after=exc.retry_after)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.error_type,
                          "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after)))}

    def response(self) -> web.Response:
        return web.json_response(self.body(), status=self.status, headers=self.headers())


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)
