"""Wire models shared by the scheduler and its clients, one module per resource.

The service validates requests and serialises answers with exactly these classes, so the SDK and
the server cannot drift apart. The bounds they check at the door are in `sara_client.limits`.
"""

from __future__ import annotations

from .base import AnswerModel, ErrorBody, ErrorEnvelope, HealthResponse, RequestModel
from .batches import AckResponse, Batch, BatchGroup, BatchRollout, BatchStats, NextBatchRequest
from .groups import GroupOut, GroupSlot, GroupState
from .leases import (Decision, EngineLoad, GroupDecision, HeartbeatRequest, HeartbeatResponse,
                     LeaseRequest, LeaseResponse, ResultsRequest, ResultsResponse, Rollout, RolloutResult,
                     SamplingParams)
from .policy import PolicyInfo, PublishPolicyRequest
from .prompts import (MAX_PAGE, AddPromptsRequest, AddPromptsResponse, ChatMessage, ChatPrompt,
                      Posterior, PromptContent, PromptHistory, PromptIn, PromptOut, PromptPage,
                      PromptState, PromptStateRequest, PromptStateResponse, PromptSummary,
                      StoredPrompt, TextPrompt, prompt_json)
from .run import RunAction, RunControlRequest, RunState, RunStatus, WorkerGone
from .stats import Counters, Derived, Queues, StatsResponse, WorkerStats

__all__ = [
    # bases, health, errors
    "AnswerModel", "ErrorBody", "ErrorEnvelope", "HealthResponse", "RequestModel",
    # prompts
    "MAX_PAGE", "AddPromptsRequest", "AddPromptsResponse", "ChatMessage", "ChatPrompt",
    "Posterior", "PromptContent", "PromptHistory", "PromptIn", "PromptOut", "PromptPage",
    "PromptState", "PromptStateRequest", "PromptStateResponse", "PromptSummary", "StoredPrompt",
    "TextPrompt", "prompt_json",
    # policy
    "PolicyInfo", "PublishPolicyRequest",
    # leases and results
    "Decision", "EngineLoad", "GroupDecision", "HeartbeatRequest", "HeartbeatResponse",
    "LeaseRequest",
    "LeaseResponse", "ResultsRequest", "ResultsResponse", "Rollout", "RolloutResult",
    "SamplingParams",
    # batches
    "AckResponse", "Batch", "BatchGroup", "BatchRollout", "BatchStats", "NextBatchRequest",
    # groups
    "GroupOut", "GroupSlot", "GroupState",
    # run control
    "RunAction", "RunControlRequest", "RunState", "RunStatus", "WorkerGone",
    # stats
    "Counters", "Derived", "Queues", "StatsResponse", "WorkerStats",
]
