"""POST /leases, POST /leases/{id}/heartbeat."""

from fastapi import APIRouter, Request

from sara_client.limits import Identifier
from sara_client.models import HeartbeatRequest, HeartbeatResponse, LeaseRequest, LeaseResponse

from . import json_response
from ..deps import AUTH_RESPONSES, SchedulerDep, WorkerRole, check_worker

router = APIRouter(prefix="/leases", tags=["workers"], dependencies=[WorkerRole],
                   responses=AUTH_RESPONSES)


@router.post("", response_model=LeaseResponse,
             responses={409: {"description": "stale_weights: the stated policy_version is too "
                                             "old; detail names current_version and checkpoint"}})
async def lease(body: LeaseRequest, scheduler: SchedulerDep, request: Request):
    """Lease rollouts to generate; long-polls up to wait_s when there is nothing to do."""
    check_worker(request, body.worker_id)
    return json_response(await scheduler.lease_json(body))


@router.post("/{lease_id}/heartbeat", response_model=HeartbeatResponse,
             responses={404: {"description": "Unknown or expired lease"},
                        409: {"description": "Lease held by another worker"}})
async def heartbeat(lease_id: Identifier, body: HeartbeatRequest,
                    scheduler: SchedulerDep, request: Request) -> HeartbeatResponse:
    """Extend a lease; answers the worker's cancel list."""
    check_worker(request, body.worker_id)
    return await scheduler.heartbeat(lease_id, body.worker_id)
