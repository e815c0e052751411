"""Wire models of run control: pausing, draining and resuming a run, what holds it up, and a
worker leaving it."""

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
    warnings: list[str] = Field(
        default_factory=list, description="What holds the run up now, e.g. ready groups that "
                                          "wait for a trainer to pull them.")


class WorkerGone(AnswerModel):
    """A worker that stopped on request: /stats shows it stopped."""

    worker_id: str
    known: bool = Field(description="Whether the scheduler knew the worker (false: never seen, "
                                    "or forgotten after SARA_RETENTION_S unseen).")
