"""The prompts resource: POST /prompts (register), GET /prompts (one page, operators),
GET /prompts/{id}, PATCH /prompts/{id} (disable or enable) and DELETE /prompts/{id}. Reading
one prompt needs a reader token, listing an operator's, changes an admin's."""

from typing import Annotated

from fastapi import APIRouter, Query

from sara_client.limits import Identifier
from sara_client.models import (AddPromptsRequest, AddPromptsResponse, Posterior, PromptHistory,
                                PromptOut, MAX_PAGE, PromptPage, PromptStateRequest,
                                PromptStateResponse, PromptSummary)

from ..deps import AUTH_RESPONSES, NOT_FOUND, AdminRole, OperatorRole, ReaderRole, SchedulerDep
from ...store.codec import StoredPosterior
from ...settings import Settings

router = APIRouter(prefix="/prompts", tags=["prompts"], responses=AUTH_RESPONSES)
MAX_CURSOR = 2**64 - 1  # Redis SCAN cursors are unsigned 64-bit: a larger one is its error


@router.post("", response_model=AddPromptsResponse, dependencies=[AdminRole])
async def add_prompts(body: AddPromptsRequest, scheduler: SchedulerDep) -> AddPromptsResponse:
    """Register prompts; idempotent on id (an id registered with other content keeps its
    content, and the answer lists it in content_differs)."""
    return await scheduler.add_prompts(body)


@router.get("", response_model=PromptPage, dependencies=[OperatorRole])
async def list_prompts(scheduler: SchedulerDep,
                       cursor: Annotated[int, Query(ge=0, le=MAX_CURSOR)] = 0,
                       limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100) -> PromptPage:
    """One page of prompts with their state and posteriors; follow `next_cursor`."""
    nxt, page = await scheduler.store.prompts.list_prompts(cursor, limit)
    items = []
    for p in page:
        posterior, history = posterior_of(p.posterior, scheduler.settings)
        items.append(PromptSummary(id=p.prompt_id, prompt=p.content.get("prompt", ""),
                                   task=p.content.get("task", "exact"), state=p.state,
                                   posterior=posterior, history=history))
    return PromptPage(prompts=items, next_cursor=nxt or None)


@router.get("/{prompt_id}", response_model=PromptOut, dependencies=[ReaderRole],
            responses=NOT_FOUND)
async def get_prompt(prompt_id: Identifier, scheduler: SchedulerDep) -> PromptOut:
    """A prompt with its posterior and history."""
    content, post = await scheduler.store.prompts.get_prompt(prompt_id)
    posterior, history = posterior_of(post, scheduler.settings)
    return PromptOut(
        id=prompt_id, prompt=content["prompt"], answer=content.get("answer"),
        task=content.get("task", "exact"), meta=content.get("meta") or {},
        posterior=posterior, history=history)


@router.patch("/{prompt_id}", response_model=PromptStateResponse, dependencies=[AdminRole],
              responses=NOT_FOUND)
async def set_prompt_state(prompt_id: Identifier, body: PromptStateRequest,
                           scheduler: SchedulerDep) -> PromptStateResponse:
    """Disable (never opened again; groups in flight finish) or re-enable a prompt."""
    state = await scheduler.store.prompts.set_prompt_state("enable" if body.enabled else "disable",
                                                   prompt_id)
    return PromptStateResponse(id=prompt_id, state=state)


@router.delete("/{prompt_id}", response_model=PromptStateResponse, dependencies=[AdminRole],
               responses=NOT_FOUND)
async def delete_prompt(prompt_id: Identifier, scheduler: SchedulerDep) -> PromptStateResponse:
    """Remove a prompt and its posterior; groups in flight finish and are delivered. Adding
    the id again registers it afresh."""
    state = await scheduler.store.prompts.set_prompt_state("delete", prompt_id)
    return PromptStateResponse(id=prompt_id, state=state)


def posterior_of(post: StoredPosterior, s: Settings) -> tuple[Posterior, PromptHistory]:
    """A stored posterior as the answer's posterior and history (the prior where unset)."""
    return (Posterior(alpha=post.alpha if post.alpha is not None else s.prior_alpha,
                      beta=post.beta if post.beta is not None else s.prior_beta,
                      version=post.version or 0, epoch=post.clock),
            PromptHistory(groups=post.groups, committed=post.committed, abandoned=post.abandoned,
                          rollouts=post.rollouts, successes=post.successes,
                          last_group_id=post.last_group))
