"""Wire models of run control: listing and disabling prompts, pausing and draining a run."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .models import Posterior, PromptHistory, AnswerModel, RequestModel
from .prompts import StoredPrompt

PromptState = Literal["enabled", "disabled", "deleted"]
RunState = Literal["running", "paused", "draining", "drained"]
RunAction = Literal["pause", "resume", "drain"]
MAX_PAGE = 1000


class PromptSummary(AnswerModel):
    id: str
    prompt: StoredPrompt   # text, or chat messages
    task: str
    state: PromptState
    posterior: Posterior
    history: PromptHistory


class PromptPage(AnswerModel):
    prompts: list[PromptSummary]
    next_cursor: int | None = Field(description="Pass as `cursor` for the next page; none at "
                                    "the end. Prompts changed meanwhile may be missed or repeated.")


class PromptStateRequest(RequestModel):
    enabled: bool = Field(description="False: never open this prompt again (groups in flight "
                                      "finish); true: back into the pool.")


class PromptStateResponse(AnswerModel):
    id: str
    state: PromptState


class RunControlRequest(RequestModel):
    action: RunAction = Field(description="pause: no group opens and nothing is leased; drain: "
                              "no group opens, in-flight work finishes and is delivered; resume: "
                              "back to running.")


class RunStatus(AnswerModel):
    namespace: str
    state: RunState
