"""Wire models of leases and results: a worker leases rollouts (with the sampling to use),
keeps them alive by heartbeat, and reports each one's reward; the answer carries SARA's
decision on each group the report touched."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ..limits import (MAX_COMPLETION_CHARS, MAX_RESULTS_PER_CALL, MAX_ROLLOUTS_PER_LEASE,
                      MAX_TOKENS_PER_ROLLOUT, MAX_WAIT_S, Identifier, Logprobs, StoredInt,
                      TokenId)
from .base import AnswerModel, RequestModel
from .policy import PolicyInfo
from .prompts import StoredPrompt

Decision = Literal["commit", "abandon", "continue"]


class SamplingParams(AnswerModel):
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    seed: int | None = None


class EngineLoad(RequestModel):
    """How full a worker's engine has been: what /stats shows as engine occupancy."""

    occupancy: float = Field(ge=0.0, le=1.0, allow_inf_nan=False, description=(
        "Time-weighted share of the engine's slots generating since the worker's previous "
        "lease: min(rollouts generating, slots) / slots."))
    slots: int = Field(ge=1, le=1_000_000, description=(
        "Requests the engine runs at once (vLLM's max_num_seqs; else the worker's capacity)."))


class LeaseRequest(RequestModel):
    worker_id: Identifier
    max_rollouts: int = Field(default=64, ge=1, le=MAX_ROLLOUTS_PER_LEASE)
    wait_s: float = Field(default=0.0, ge=0.0, le=MAX_WAIT_S)
    backend: str | None = Field(default=None, max_length=64)
    policy_version: StoredInt | None = Field(
        default=None, description="The policy version the worker's weights hold. One older than "
                                  "the current version minus max_staleness is refused: 409 "
                                  "stale_weights, its detail naming current_version and "
                                  "checkpoint (load it, then lease again). Unset: not checked.")
    engine: EngineLoad | None = Field(
        default=None, description="The worker's engine load since its previous lease, for "
                                  "/stats' engine occupancy. Unset: not reported.")


class Rollout(AnswerModel):
    rollout_id: str
    group_id: str
    prompt_id: str
    prompt: StoredPrompt
    task: str
    answer: str | None = None
    meta: dict[str, Any] = Field(default_factory=dict)
    sampling: SamplingParams
    priority: int = Field(0, description=(
        "1 for the rest of a group already committed (its first rollouts are done): an engine "
        "that schedules by priority should run it before new groups' first rollouts, so the "
        "group reaches the trainer a generation sooner."))


class LeaseResponse(AnswerModel):
    lease_id: str | None = Field(description="None when nothing was leased.")
    expires_at: float | None = None
    policy: PolicyInfo
    rollouts: list[Rollout] = Field(default_factory=list)
    cancel: list[str] = Field(default_factory=list,
                              description="Rollout ids this worker should abort now.")


class HeartbeatRequest(RequestModel):
    worker_id: Identifier


class HeartbeatResponse(AnswerModel):
    lease_id: str
    expires_at: float
    cancel: list[str] = Field(default_factory=list)


class RolloutResult(RequestModel):
    rollout_id: Identifier
    reward: float = Field(ge=-1e6, le=1e6, allow_inf_nan=False)
    completion: str = Field(default="", max_length=MAX_COMPLETION_CHARS)
    completion_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS_PER_ROLLOUT)
    finish_reason: str = Field(default="stop", max_length=32,
                               description="stop, length or abort (cancelled mid-generation).")
    policy_version: StoredInt | None = Field(
        default=None, description="Version generation started at; unset: the version its "
                                  "lease was granted under.")
    policy_version_end: StoredInt | None = Field(
        default=None, description="Version loaded when generation ended (an engine that took "
                                  "new weights mid-generation); unset: policy_version.")
    token_ids: list[TokenId] | None = Field(default=None, max_length=MAX_TOKENS_PER_ROLLOUT)
    logprobs: Logprobs = Field(default=None, max_length=MAX_TOKENS_PER_ROLLOUT,
                               description="Finite only: send -1e4 for -inf.")


class ResultsRequest(RequestModel):
    worker_id: Identifier
    results: list[RolloutResult] = Field(min_length=1, max_length=MAX_RESULTS_PER_CALL)
    report_id: Identifier | None = Field(
        default=None,
        description="Idempotency key, unique per worker: a report sent again with the same id "
                    "(a retry after a timeout or a 503) changes nothing and gets the first "
                    "call's answer, decisions and cancels included, for SARA_REPORT_TTL_S.")


class GroupDecision(AnswerModel):
    group_id: str
    decision: Decision


class ResultsResponse(AnswerModel):
    accepted: int = Field(description="Results that filled a rollout slot for the first time.")
    duplicates: int = Field(default=0, description="Results for slots already filled (ignored).")
    late: int = Field(default=0, description="Results for cancelled rollouts: they teach the posterior only, once per slot.")
    released: int = Field(default=0, description="Aborted rollouts handed back for re-issue.")
    decisions: list[GroupDecision] = Field(default_factory=list)
    cancel: list[str] = Field(default_factory=list)
