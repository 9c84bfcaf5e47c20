"""The ZeroMQ client library of tessera: `Client` (blocking) and `AsyncClient` (asyncio).

Both talk to a running engine through its run directory: requests go to the tokenizer,
outputs come back to the client's own reply socket. Errors are typed and carry the HTTP
status the server answers with (see `errors.py`).
"""

from tessera.client.async_client import AsyncClient, AsyncStream
from tessera.client.errors import (
    AuthenticationError,
    BadRequestError,
    EngineDeadError,
    EngineNotFoundError,
    InternalError,
    NotFoundError,
    OverloadedError,
    PromptTooLongError,
    RateLimitError,
    RequestTimeoutError,
    SlowConsumerError,
    TesseraError,
    UnavailableError,
)
from tessera.client.outputs import (
    Choice,
    Delta,
    GenerateResult,
    PromptLogprob,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from tessera.client.sampling import CheckedSampling, check_sampling
from tessera.client.sync_client import Client, Stream

__all__ = [
    "AsyncClient", "AsyncStream", "AuthenticationError", "BadRequestError", "CheckedSampling",
    "Choice", "Client", "check_sampling",
    "Delta", "EngineDeadError", "EngineNotFoundError", "GenerateResult", "InternalError",
    "NotFoundError", "OverloadedError", "PromptLogprob", "PromptTooLongError", "RateLimitError",
    "RequestTimeoutError", "SlowConsumerError", "Stream", "TesseraError", "TokenLogprob",
    "TopLogprob", "UnavailableError", "Usage",
]
