"""Wire models shared by the scheduler and its clients.

The service validates requests and serialises answers with exactly these classes, so the SDK and
the server cannot drift apart. Request models forbid unknown fields: a typo in a field name is a
422 that names it, not a silently ignored option.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .limits import (  # noqa: F401 - re-exported: the limits are part of the wire contract
    FLOOR_LOGPROB, ID_PATTERN, MAX_COMPLETION_CHARS, MAX_META_BYTES, MAX_META_DEPTH,
    MAX_CHAT_MESSAGES,
    MAX_PROMPT_CHARS, MAX_PROMPTS_PER_CALL, MAX_RESULTS_PER_CALL, MAX_ROLLOUTS_PER_LEASE,
    MAX_STORED_INT, MAX_TOKENS_PER_ROLLOUT, MAX_WAIT_S, Identifier, Logprobs, Meta, StoredInt,
    TokenId,
)
from .prompts import (  # noqa: F401 - re-exported: chat prompts are part of the wire contract
    ChatMessage, PromptContent, StoredPrompt, prompt_json,
)

Decision = Literal["commit", "abandon", "continue"]
GroupState = Literal["open", "committed", "ready", "delivered", "acked", "abandoned", "dropped"]


class RequestModel(BaseModel):
    """Base of every request body: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")


class AnswerModel(BaseModel):
    """Base of every answer body."""

    # Answers ignore unknown fields so an older client keeps working against a newer server.
    model_config = ConfigDict(extra="ignore")


# --- prompts -------------------------------------------------------------------------------------


class PromptIn(RequestModel):
    """One prompt to register. Without an id, the service derives one from the content."""

    id: Identifier | None = None
    prompt: PromptContent = Field(description="Plain text, or a list of chat messages "
                                              f"(at most {MAX_CHAT_MESSAGES}) that the policy's "
                                              "chat template renders.")
    answer: str | None = Field(default=None, max_length=MAX_PROMPT_CHARS)
    task: str = Field(default="exact", pattern=r"^[A-Za-z0-9_.\-]{1,64}$",
                      description="Verifier name the worker scores this prompt with.")
    meta: Meta = Field(default_factory=dict,
                       description=f"Free-form metadata (at most {MAX_META_DEPTH} levels deep, "
                                   f"{MAX_META_BYTES} bytes); the sim backend reads p_success.")


class AddPromptsRequest(RequestModel):
    prompts: list[PromptIn] = Field(min_length=1, max_length=MAX_PROMPTS_PER_CALL)


class AddPromptsResponse(AnswerModel):
    ids: list[str]
    created: int = Field(description="How many of the ids were new; re-adding an id is a no-op.")
    content_differs: list[str] = Field(
        default_factory=list, description="Ids already registered with other content: the "
                                          "stored content was kept (register it under a new id).")


class Posterior(AnswerModel):
    alpha: float
    beta: float
    version: int = Field(description="Policy version the counts were last decayed to.")
    epoch: float | None = Field(None, description="Epochs of the pool (prompts consumed per "
                                "prompt) the counts were last decayed to; none before any result.")


class PromptHistory(AnswerModel):
    groups: int = 0
    committed: int = 0
    abandoned: int = 0
    rollouts: int = 0
    successes: int = 0
    last_group_id: str | None = None


class PromptOut(AnswerModel):
    id: str
    prompt: StoredPrompt
    answer: str | None = None
    task: str
    meta: dict[str, Any] = Field(default_factory=dict)
    posterior: Posterior
    history: PromptHistory


# --- policy --------------------------------------------------------------------------------------


class PolicyInfo(AnswerModel):
    version: int = 0
    checkpoint: str | None = None


class PublishPolicyRequest(RequestModel):
    version: int = Field(ge=1, le=MAX_STORED_INT,
                         description="Must be greater than the current version (and below 2**53).")
    checkpoint: str | None = Field(default=None, max_length=4096)


# --- leases --------------------------------------------------------------------------------------


class SamplingParams(AnswerModel):
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    seed: int | None = None


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


class Rollout(AnswerModel):
    rollout_id: str
    group_id: str
    prompt_id: str
    prompt: StoredPrompt
    task: str
    answer: str | None = None
    meta: dict[str, Any] = Field(default_factory=dict)
    sampling: SamplingParams


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


# --- results -------------------------------------------------------------------------------------


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


# --- batches -------------------------------------------------------------------------------------


class NextBatchRequest(RequestModel):
    size: int | None = Field(default=None, ge=1, le=4096,
                             description="Groups per batch; default the scheduler's batch_size.")
    wait_s: float = Field(default=0.0, ge=0.0, le=MAX_WAIT_S)


class BatchRollout(AnswerModel):
    rollout_id: str
    completion: str
    reward: float
    completion_tokens: int
    finish_reason: str = "stop"
    policy_version: int
    policy_version_end: int | None = None  # when the worker reported one (unset: the same)
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None


class BatchGroup(AnswerModel):
    group_id: str
    prompt_id: str
    prompt: StoredPrompt
    answer: str | None = None
    task: str = "exact"
    rollouts: list[BatchRollout]


class BatchStats(AnswerModel):
    rollouts_spent: int = Field(0, description="Rollouts completed since the previous batch.")
    rollouts_cancelled: int = 0
    tokens_spent: int = 0
    groups_committed: int = 0
    groups_abandoned: int = 0
    groups_dropped: int = 0
    rollouts_not_spent_on_abandoned_groups: int = Field(
        0, description="k - issued summed over groups abandoned in this window (not a saving: "
                       "false abandons cost mixed groups elsewhere).")
    ds_rollouts_per_effective_group: float | None = Field(
        None, description="Run-so-far estimate, when the batch was read, of what Dynamic "
                          "Sampling would spend per effective group (audit sampling).")
    ds_rollouts_per_effective_group_low: float | None = Field(None, description="95% interval.")
    ds_rollouts_per_effective_group_high: float | None = Field(None, description="95% interval.")
    ended_early: bool = Field(False, description="Closed by max_rollouts_per_batch.")


class Batch(AnswerModel):
    batch_id: str
    policy_version: int
    created_at: float
    redelivered: bool = False
    groups: list[BatchGroup]
    stats: BatchStats
    sampling: SamplingParams | None = Field(
        None, description="The scheduler's sampling settings, which the rollouts were generated "
                          "with: the trainer takes logprobs at its temperature and normalises "
                          "Dr. GRPO's loss by its max_tokens.")


class AckResponse(AnswerModel):
    batch_id: str
    acked: bool
    already_acked: bool = False


# --- groups, stats, health -----------------------------------------------------------------------


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
