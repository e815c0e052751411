"""Wire models of batches: what `POST /batches/next` delivers to the trainer (groups of
rollouts, the sampling they were drawn with, the figures of the run so far) and the ack."""

from __future__ import annotations


from pydantic import Field

from ..limits import MAX_WAIT_S
from .base import AnswerModel, RequestModel
from .leases import SamplingParams
from .prompts import StoredPrompt


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
    drawn_rewards: list[float] | None = Field(
        None, description="Every reward the group drew, in slot order, when the rollouts "
                          "delivered are a subset of them (SARA_POLICY=reinforce_ada keeps "
                          "SARA_ADA_KEEP): the pool its paper takes the advantage baseline over "
                          "('global statistics'); null when every rollout drawn is delivered.")


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
    age_versions_mean: float | None = Field(
        None, description="Policy versions the batch's groups lag, on average: the version when "
                          "it formed minus each group's oldest result's.")


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
