"""POST /results."""

from fastapi import APIRouter, Request

from sara_client.models import ResultsRequest, ResultsResponse

from . import body_doc, json_body, json_response
from ..deps import AUTH_RESPONSES, SchedulerDep, WorkerRole, check_worker

router = APIRouter(prefix="/results", tags=["workers"], dependencies=[WorkerRole],
                   responses=AUTH_RESPONSES)


# the body is parsed by json_body: results carry token ids and logprobs by the thousand
@router.post("", response_model=ResultsResponse, openapi_extra=body_doc(ResultsRequest),
             responses={404: {"description": "Unknown rollout ids; nothing was applied"}})
async def report(scheduler: SchedulerDep, request: Request):
    """Report rewards; answers the decisions taken and the worker's cancel list."""
    body = await json_body(request, ResultsRequest)
    check_worker(request, body.worker_id)
    bound = getattr(request.state, "bound_worker", None) is not None
    return json_response(await scheduler.report(body, holder_only=bound))
