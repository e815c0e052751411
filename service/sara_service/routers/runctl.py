"""Run control for operators: GET /prompts (paged), PATCH and DELETE /prompts/{id}, GET and
POST /run (pause, resume, drain). Listing needs an operator token; changes need admin."""

from typing import Annotated

from fastapi import APIRouter, Query

from sara_client.models import Identifier
from sara_client.models_runctl import (MAX_PAGE, PromptPage, PromptStateRequest,
                                       PromptStateResponse, PromptSummary, RunControlRequest,
                                       RunStatus)

from ..deps import AUTH_RESPONSES, NOT_FOUND, AdminRole, OperatorRole, SchedulerDep
from .prompts import posterior_of

router = APIRouter(tags=["run control"], responses=AUTH_RESPONSES)
MAX_CURSOR = 2**64 - 1  # Redis SCAN cursors are unsigned 64-bit: a larger one is its error


@router.get("/prompts", response_model=PromptPage, dependencies=[OperatorRole])
async def list_prompts(scheduler: SchedulerDep, cursor: Annotated[int, Query(ge=0, le=MAX_CURSOR)] = 0,
                       limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100) -> PromptPage:
    """One page of prompts with their state and posteriors; follow `next_cursor`."""
    nxt, page = await scheduler.store.list_prompts(cursor, limit)
    items = []
    for p in page:
        posterior, history = posterior_of(p.posterior, scheduler.settings)
        items.append(PromptSummary(id=p.prompt_id, prompt=p.content.get("prompt", ""),
                                   task=p.content.get("task", "exact"), state=p.state,
                                   posterior=posterior, history=history))
    return PromptPage(prompts=items, next_cursor=nxt or None)


@router.patch("/prompts/{prompt_id}", response_model=PromptStateResponse,
              dependencies=[AdminRole], responses=NOT_FOUND)
async def set_prompt_state(prompt_id: Identifier, body: PromptStateRequest,
                           scheduler: SchedulerDep) -> PromptStateResponse:
    """Disable (never opened again; groups in flight finish) or re-enable a prompt."""
    state = await scheduler.store.set_prompt_state("enable" if body.enabled else "disable",
                                                   prompt_id)
    return PromptStateResponse(id=prompt_id, state=state)


@router.delete("/prompts/{prompt_id}", response_model=PromptStateResponse,
               dependencies=[AdminRole], responses=NOT_FOUND)
async def delete_prompt(prompt_id: Identifier, scheduler: SchedulerDep) -> PromptStateResponse:
    """Remove a prompt and its posterior; groups in flight finish and are delivered. Adding
    the id again registers it afresh."""
    state = await scheduler.store.set_prompt_state("delete", prompt_id)
    return PromptStateResponse(id=prompt_id, state=state)


@router.get("/run", response_model=RunStatus, dependencies=[OperatorRole])
async def run_status(scheduler: SchedulerDep) -> RunStatus:
    """running | paused | draining | drained."""
    return RunStatus(namespace=scheduler.settings.namespace,
                     state=await scheduler.store.run_state())


@router.post("/run", response_model=RunStatus, dependencies=[AdminRole])
async def control_run(body: RunControlRequest, scheduler: SchedulerDep) -> RunStatus:
    """Pause (workers get empty leases; results are still accepted and ready groups still form
    batches), drain (no new groups; in-flight work finishes and is delivered) or resume."""
    await scheduler.store.set_run_state(body.action)
    return RunStatus(namespace=scheduler.settings.namespace,
                     state=await scheduler.store.run_state())
