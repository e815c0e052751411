"""Request dependencies: the scheduler, and bearer-token role checks."""

from __future__ import annotations

import hmac
from typing import AbstractSet, Annotated, Callable

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from sara_client.models import ErrorEnvelope

from .credentials import worker_of
from ..errors import Forbidden, Unauthorized
from ..core.scheduler import Scheduler
from ..settings import Settings

_bearer = HTTPBearer(auto_error=False, description="Role token: worker, trainer, operator or admin.")


async def get_scheduler(request: Request) -> Scheduler:
    return request.app.state.scheduler


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


SchedulerDep = Annotated[Scheduler, Depends(get_scheduler)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def role_of(settings: Settings, token: str) -> str | None:
    """The role a token grants, compared in constant time against every configured token."""
    found = None
    for role in ("admin", "operator", "trainer", "worker"):
        secret = getattr(settings, f"{role}_token")
        # compare against all of them, so timing does not reveal which role matched
        if secret is not None and hmac.compare_digest(secret.get_secret_value().encode(),
                                                      token.encode()):
            found = found or role
    return found


def check_role(settings: Settings, token: str | None, allowed: AbstractSet[str], action: str,
               missing: str) -> tuple[str, str | None]:
    """The role `token` grants and the worker it is bound to (a per-worker token), when that role
    is one of `allowed`: 401 with `missing` when there is no token, 401 when the token is
    unknown, 403 naming `action` when its role may not do it."""
    if not token:
        raise Unauthorized(message=missing)
    role, bound = role_of(settings, token), None
    if role is None and settings.worker_secret is not None:
        bound = worker_of(settings.worker_secret.get_secret_value(), token)
        role = "worker" if bound is not None else None
    if role is None:
        raise Unauthorized(message="invalid token")
    if role not in allowed:
        raise Forbidden(message=f"a {role} token may not {action}; needs one of {sorted(allowed)}")
    return role, bound


def require(*roles: str) -> Callable:
    """Dependency allowing `roles` (and admin); open when no tokens are configured."""
    allowed = {"admin", *roles}

    # async: a plain def would be run in a thread pool on every request
    async def check(request: Request, settings: SettingsDep, creds: Credentials) -> str | None:
        if not settings.auth_enabled:
            return None
        role, bound = check_role(
            settings, creds.credentials if creds is not None else None, allowed, "do this",
            missing="missing bearer token: send 'Authorization: Bearer <token>'")
        if bound is not None:
            request.state.bound_worker = bound
        return role

    return check


def check_worker(request: Request, worker_id: str) -> None:
    """403 unless the request may act as `worker_id`: a per-worker token acts as its own worker
    only; the shared worker token and the admin token (and an open API) as any."""
    bound = getattr(request.state, "bound_worker", None)
    if bound is not None and bound != worker_id:
        raise Forbidden(message=f"this token belongs to worker {bound!r}; it may not act as "
                                f"worker {worker_id!r}")


WorkerRole = Depends(require("worker"))
TrainerRole = Depends(require("trainer"))
AdminRole = Depends(require())
ReaderRole = Depends(require("operator", "trainer"))
OperatorRole = Depends(require("operator"))
AnyRole = Depends(require("operator", "trainer", "worker"))


# OpenAPI entries for what every secured route can answer before its handler runs.
AUTH_RESPONSES: dict[int | str, dict] = {
    401: {"model": ErrorEnvelope, "description": "Missing or invalid bearer token"},
    403: {"model": ErrorEnvelope, "description": "The token's role may not do this"},
}
NOT_FOUND: dict[int | str, dict] = {404: {"model": ErrorEnvelope, "description": "Unknown id"}}


def error_doc(description: str) -> dict:
    """OpenAPI entry for a JSON error envelope on a route whose own answers are not JSON."""
    ref = {"$ref": "#/components/schemas/ErrorEnvelope"}
    return {"description": description, "content": {"application/json": {"schema": ref}}}


NON_JSON_AUTH_RESPONSES: dict[int | str, dict] = {
    401: error_doc("Missing or invalid bearer token"),
    403: error_doc("The token's role may not do this"),
    422: error_doc("Invalid request"),
}
