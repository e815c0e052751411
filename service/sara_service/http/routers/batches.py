"""POST /batches/next, POST /batches/{id}/ack."""

from fastapi import APIRouter, Response

from sara_client.limits import Identifier
from sara_client.models import AckResponse, Batch, NextBatchRequest

from . import json_response
from ..deps import AUTH_RESPONSES, SchedulerDep, TrainerRole

router = APIRouter(prefix="/batches", tags=["trainer"], dependencies=[TrainerRole],
                   responses=AUTH_RESPONSES)


@router.post("/next", response_model=Batch,
             responses={204: {"description": "No batch ready within wait_s"}})
async def next_batch(scheduler: SchedulerDep, body: NextBatchRequest | None = None):
    """The next batch of effective groups; long-polls up to wait_s, then 204."""
    await scheduler.store.run.note_trainer(scheduler.clock())
    batch = await scheduler.next_batch_json(body or NextBatchRequest())
    if batch is None:
        return Response(status_code=204)
    return json_response(batch)


@router.post("/{batch_id}/ack", response_model=AckResponse,
             responses={404: {"description": "Unknown batch"}})
async def ack(batch_id: Identifier, scheduler: SchedulerDep) -> AckResponse:
    """Confirm a batch was consumed; unacked batches are redelivered after their timeout."""
    await scheduler.store.run.note_trainer(scheduler.clock())
    return await scheduler.ack(batch_id)
