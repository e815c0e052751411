"""The run resource: GET /run (its state and what holds it up, any role: a worker that finds no
work asks here why), POST /run (pause, resume, drain; admin) and DELETE /workers/{id} (a worker
that stops leaves the run: /stats shows it stopped at once)."""

from fastapi import APIRouter, Request

from sara_client.limits import Identifier
from sara_client.models import RunControlRequest, RunStatus, WorkerGone

from ..deps import AUTH_RESPONSES, AdminRole, AnyRole, SchedulerDep, WorkerRole, check_worker
from ...core.observability import run_warnings

router = APIRouter(tags=["run"], responses=AUTH_RESPONSES)


async def _status(scheduler) -> RunStatus:
    return RunStatus(namespace=scheduler.settings.namespace,
                     state=await scheduler.store.run.run_state(),
                     warnings=await run_warnings(scheduler.store, scheduler.settings,
                                                 scheduler.clock()))


@router.get("/run", response_model=RunStatus, dependencies=[AnyRole])
async def run_status(scheduler: SchedulerDep) -> RunStatus:
    """running | paused | draining | drained, and what holds the run up (warnings)."""
    return await _status(scheduler)


@router.post("/run", response_model=RunStatus, dependencies=[AdminRole])
async def control_run(body: RunControlRequest, scheduler: SchedulerDep) -> RunStatus:
    """Pause (workers get empty leases; results are still accepted and ready groups still form
    batches), drain (no new groups; in-flight work finishes and is delivered) or resume."""
    await scheduler.store.run.set_run_state(body.action)
    return await _status(scheduler)


@router.delete("/workers/{worker_id}", response_model=WorkerGone, dependencies=[WorkerRole],
               tags=["workers"])
async def stop_worker(worker_id: Identifier, scheduler: SchedulerDep,
                      request: Request) -> WorkerGone:
    """A worker that stops on request leaves the run: /stats shows it stopped at once, with
    what it did, not live (nor, later, stale); seen again, it is live again."""
    check_worker(request, worker_id)
    return WorkerGone(worker_id=worker_id,
                      known=await scheduler.store.run.stop_worker(scheduler.clock(), worker_id))
