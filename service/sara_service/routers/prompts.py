"""POST /prompts, GET /prompts/{id}."""

from fastapi import APIRouter

from sara_client.models import (AddPromptsRequest, AddPromptsResponse, Identifier, Posterior,
                                PromptHistory, PromptOut)

from ..deps import AUTH_RESPONSES, NOT_FOUND, AdminRole, ReaderRole, SchedulerDep
from ..redis_format import PosteriorField
from ..settings import Settings

router = APIRouter(prefix="/prompts", tags=["prompts"],
                   responses=AUTH_RESPONSES)


@router.post("", response_model=AddPromptsResponse, dependencies=[AdminRole])
async def add_prompts(body: AddPromptsRequest, scheduler: SchedulerDep) -> AddPromptsResponse:
    """Register prompts; idempotent on id (an id registered with other content keeps its
    content, and the answer lists it in content_differs)."""
    return await scheduler.add_prompts(body)


@router.get("/{prompt_id}", response_model=PromptOut, dependencies=[ReaderRole],
            responses=NOT_FOUND)
async def get_prompt(prompt_id: Identifier, scheduler: SchedulerDep) -> PromptOut:
    """A prompt with its posterior and history."""
    content, post = await scheduler.store.get_prompt(prompt_id)
    posterior, history = posterior_of(post, scheduler.settings)
    return PromptOut(
        id=prompt_id, prompt=content["prompt"], answer=content.get("answer"),
        task=content.get("task", "exact"), meta=content.get("meta") or {},
        posterior=posterior, history=history)


def posterior_of(post: dict, s: Settings) -> tuple[Posterior, PromptHistory]:
    """A stored posterior JSON as the answer's posterior and history (the prior where unset)."""
    f = PosteriorField
    return (Posterior(alpha=post.get(f.alpha, s.prior_alpha), beta=post.get(f.beta, s.prior_beta),
                      version=int(post.get(f.version, 0)), epoch=post.get(f.clock)),
            PromptHistory(groups=post.get(f.groups, 0), committed=post.get(f.committed, 0),
                          abandoned=post.get(f.abandoned, 0), rollouts=post.get(f.rollouts, 0),
                          successes=post.get(f.successes, 0),
                          last_group_id=post.get(f.last_group)))
