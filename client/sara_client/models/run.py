"""Wire models of run control: pausing, draining and resuming a run."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import AnswerModel, RequestModel

RunState = Literal["running", "paused", "draining", "drained"]
RunAction = Literal["pause", "resume", "drain"]


class RunControlRequest(RequestModel):
    action: RunAction = Field(description="pause: no group opens and nothing is leased; drain: "
                              "no group opens, in-flight work finishes and is delivered; resume: "
                              "back to running.")


class RunStatus(AnswerModel):
    namespace: str
    state: RunState
