"""Typed errors raised by the SARA clients.

Every error the SDK raises for a failed call derives from :class:`SaraError`, so one ``except
SaraError`` catches them all. HTTP errors are mapped by status code; the service's error envelope
``{"error": {"code", "message", "detail"}}`` fills ``code``, ``message`` and ``detail``, and when a
body is not an envelope (a proxy's page, FastAPI's own ``{"detail": ...}``) the text body is used.

``retryable`` says whether the client's retry loop may try the call again: only
:class:`ServiceUnavailableError` (HTTP 503) and :class:`SaraConnectionError` raised before the
request reached the server (connection refused, connect timeout, pool timeout) are retryable.
"""

from __future__ import annotations

from typing import Any

import httpx

__all__ = [
    "SaraError",
    "BadRequestError",
    "AuthenticationError",
    "PermissionDeniedError",
    "NotFoundError",
    "ConflictError",
    "StaleWeightsError",
    "PayloadTooLargeError",
    "ServiceUnavailableError",
    "ServerError",
    "SaraConnectionError",
    "SaraTimeoutError",
    "UnexpectedResponseError",
    "error_class_for_status",
]


class SaraError(Exception):
    """Base of every SDK error: an HTTP status (None for transport failures) and the envelope."""

    default_code = "error"
    retryable = False

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        code: str | None = None,
        detail: Any = None,
        response: httpx.Response | None = None,
    ) -> None:
        self.status_code = status_code
        self.code = code or self.default_code
        self.message = message
        self.detail = detail
        self.response = response
        super().__init__(message)

    def __str__(self) -> str:
        prefix = f"HTTP {self.status_code} " if self.status_code is not None else ""
        return f"{prefix}{self.code}: {self.message}"

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(status_code={self.status_code!r}, code={self.code!r}, "
                f"message={self.message!r}, detail={self.detail!r})")


class BadRequestError(SaraError):
    """400 or 422: the request was malformed or broke a limit (the message names the field)."""

    default_code = "bad_request"


class AuthenticationError(SaraError):
    """401: no bearer token, or one the service does not know."""

    default_code = "unauthorized"


class PermissionDeniedError(SaraError):
    """403: the token's role may not call this route."""

    default_code = "forbidden"


class NotFoundError(SaraError):
    """404: no such prompt, group, lease, batch or rollout."""

    default_code = "not_found"


class ConflictError(SaraError):
    """409: the request conflicts with the current state (e.g. a stale policy version)."""

    default_code = "conflict"


class StaleWeightsError(ConflictError):
    """409 ``stale_weights``: the lease stated a policy version older than the current one minus
    ``max_staleness``. Not retried as it is: load ``checkpoint`` (version ``current_version``),
    then lease again with the new version (``sara worker`` does)."""

    default_code = "stale_weights"

    @property
    def current_version(self) -> int:
        return int((self.detail or {}).get("current_version", 0))

    @property
    def checkpoint(self) -> str | None:
        return (self.detail or {}).get("checkpoint")


class PayloadTooLargeError(SaraError):
    """413: the raw request body exceeds the service's size cap."""

    default_code = "payload_too_large"


class ServiceUnavailableError(SaraError):
    """503: the service (or its Redis) is not available right now. Retryable.

    ``retry_after`` holds the seconds from a ``Retry-After`` header, when the service sent one.
    """

    default_code = "service_unavailable"
    retryable = True

    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


class ServerError(SaraError):
    """Any other 5xx answer."""

    default_code = "server_error"


class UnexpectedResponseError(SaraError):
    """A success status whose body is not what the route promises (wrong JSON shape, not JSON)."""

    default_code = "unexpected_response"


class SaraConnectionError(SaraError):
    """The HTTP transport failed; ``__cause__`` and ``error`` hold the httpx exception.

    Retryable when the request cannot have reached the service (connect errors and connect or
    pool timeouts); a failure after the request was sent (read error, read timeout) is not retried,
    since the service may already have acted on it.
    """

    default_code = "connection_error"
    retryable = True

    def __init__(self, error: httpx.TransportError, *, retryable: bool | None = None) -> None:
        what = str(error) or type(error).__name__
        try:   # the URL it tried: what a person needs to see a wrong address or port
            request = error.request
            what = f"{request.method} {request.url}: {what}"
        except RuntimeError:   # an httpx error raised without its request
            pass
        super().__init__(what)
        self.error = error
        if retryable is not None:
            self.retryable = retryable


class SaraTimeoutError(SaraConnectionError):
    """An httpx timeout (connect, read, write or pool)."""

    default_code = "timeout"


_BY_STATUS: dict[int, type[SaraError]] = {
    400: BadRequestError,
    422: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    503: ServiceUnavailableError,
}


def error_class_for_status(status_code: int) -> type[SaraError]:
    """The error class an HTTP status maps to (:class:`SaraError` for unmapped statuses)."""
    if status_code in _BY_STATUS:
        return _BY_STATUS[status_code]
    if 500 <= status_code <= 599:
        return ServerError
    return SaraError
