"""Wire models of the policy: the version and checkpoint the trainer publishes."""

from __future__ import annotations

from pydantic import Field

from ..limits import MAX_STORED_INT
from .base import AnswerModel, RequestModel


class PolicyInfo(AnswerModel):
    version: int = 0
    checkpoint: str | None = None


class PublishPolicyRequest(RequestModel):
    version: int = Field(ge=1, le=MAX_STORED_INT,
                         description="Must be greater than the current version (and below 2**53).")
    checkpoint: str | None = Field(default=None, max_length=4096)
