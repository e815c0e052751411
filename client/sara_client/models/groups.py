"""Wire models of a group as `GET /groups/{id}` shows it: its state, counts, SARA's
thresholds and p_eff, and each rollout slot."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import AnswerModel

GroupState = Literal["open", "committed", "ready", "delivered", "acked", "abandoned", "dropped"]


class GroupSlot(AnswerModel):
    rollout_id: str
    state: Literal["pending", "leased", "done", "cancelled", "unissued"]
    worker_id: str | None = None
    reward: float | None = None


class GroupOut(AnswerModel):
    group_id: str
    prompt_id: str
    state: GroupState
    k: int
    issued: int
    done: int
    successes: int
    failures: int
    cancelled: int
    abandon_after_failures: int = Field(description="All-fail count at which SARA abandons (k+1: never).")
    abandon_after_successes: int
    p_eff: float = Field(description="Current P(full group is mixed | outcomes so far).")
    created_at: float
    rollouts: list[GroupSlot]
