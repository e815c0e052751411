"""The run resource: GET /run (its state, operators) and POST /run (pause, resume, drain;
admin)."""

from fastapi import APIRouter

from sara_client.models import RunControlRequest, RunStatus

from ..deps import AUTH_RESPONSES, AdminRole, OperatorRole, SchedulerDep

router = APIRouter(prefix="/run", tags=["run"], responses=AUTH_RESPONSES)


@router.get("", response_model=RunStatus, dependencies=[OperatorRole])
async def run_status(scheduler: SchedulerDep) -> RunStatus:
    """running | paused | draining | drained."""
    return RunStatus(namespace=scheduler.settings.namespace,
                     state=await scheduler.store.run.run_state())


@router.post("", response_model=RunStatus, dependencies=[AdminRole])
async def control_run(body: RunControlRequest, scheduler: SchedulerDep) -> RunStatus:
    """Pause (workers get empty leases; results are still accepted and ready groups still form
    batches), drain (no new groups; in-flight work finishes and is delivered) or resume."""
    await scheduler.store.run.set_run_state(body.action)
    return RunStatus(namespace=scheduler.settings.namespace,
                     state=await scheduler.store.run.run_state())
