"""GET/POST /policy."""

from fastapi import APIRouter

from sara_client.models import PolicyInfo, PublishPolicyRequest

from ..deps import AUTH_RESPONSES, AnyRole, SchedulerDep, TrainerRole

router = APIRouter(prefix="/policy", tags=["trainer"],
                   responses=AUTH_RESPONSES)


@router.get("", response_model=PolicyInfo, dependencies=[AnyRole])
async def get_policy(scheduler: SchedulerDep) -> PolicyInfo:
    """The current policy version and checkpoint."""
    return await scheduler.store.policy.get_policy()


@router.post("", response_model=PolicyInfo, dependencies=[TrainerRole],
             responses={409: {"description": "Version not newer than the current one"}})
async def publish_policy(body: PublishPolicyRequest, scheduler: SchedulerDep) -> PolicyInfo:
    """Publish a new policy version; workers pick it up on their next lease."""
    return await scheduler.store.policy.publish_policy(scheduler.clock(), body.version,
                                                       body.checkpoint)
