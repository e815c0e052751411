"""The bases of every wire model, and the answers every route may give: health and the one
error envelope.

Request models forbid unknown fields: a typo in a field name is a 422 that names it, not a
silently ignored option. Answers ignore them, so an older client keeps working against a newer
server.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class RequestModel(BaseModel):
    """Base of every request body: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")


class AnswerModel(BaseModel):
    """Base of every answer body."""

    # Answers ignore unknown fields so an older client keeps working against a newer server.
    model_config = ConfigDict(extra="ignore")


class HealthResponse(AnswerModel):
    status: Literal["ok", "unavailable"]
    redis: bool | None = None
    namespace: str | None = None
    detail: str | None = Field(default=None, description="Why /healthz asks for a restart.")


class ErrorBody(AnswerModel):
    code: str
    message: str
    detail: Any = None


class ErrorEnvelope(AnswerModel):
    error: ErrorBody
