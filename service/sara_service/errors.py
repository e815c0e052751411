"""Domain errors; one exception handler in app.py maps them onto the error envelope."""

from __future__ import annotations

from typing import Any


class SaraServiceError(Exception):
    """Base: carries the HTTP status, a stable machine-readable code and a message for humans."""

    status_code = 500
    code = "internal"

    def __init__(self, code: str | None = None, message: str = "", detail: Any = None) -> None:
        super().__init__(message or self.__class__.__name__)
        if code:
            self.code = code
        self.message = message
        self.detail = detail


class Unauthorized(SaraServiceError):
    """No bearer token, or one no role has."""

    status_code = 401
    code = "unauthorized"


class Forbidden(SaraServiceError):
    """A token whose role may not do what was asked."""

    status_code = 403
    code = "forbidden"


class NotFound(SaraServiceError):
    status_code = 404
    code = "not_found"


class Conflict(SaraServiceError):
    status_code = 409
    code = "conflict"


class Unfillable(SaraServiceError):
    """A request the scheduler can never answer as asked (it would wait forever)."""

    status_code = 422
    code = "unfillable"


class UnknownRollouts(NotFound):
    """Some rollout ids in a results call are unknown; nothing of the call was applied."""

    def __init__(self, rollout_ids: list[str]) -> None:
        shown = ", ".join(rollout_ids[:5]) + (" ..." if len(rollout_ids) > 5 else "")
        super().__init__("unknown_rollout",
                         f"{len(rollout_ids)} unknown rollout id(s): {shown}; nothing was applied, "
                         "resend the others without them",
                         {"unknown_rollout_ids": rollout_ids})


class StoreUnavailable(SaraServiceError):
    """Redis cannot be reached: nothing was applied; the client should retry."""

    status_code = 503
    code = "store_unavailable"
    retry_after_s = 1

    def __init__(self, message: str) -> None:
        super().__init__(None, message)
