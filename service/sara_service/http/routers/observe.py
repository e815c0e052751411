"""GET /groups/{id}, /stats, /metrics, /healthz, /readyz."""

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from sara_client.limits import Identifier
from sara_client.models import GroupOut, HealthResponse, StatsResponse

from ..deps import AUTH_RESPONSES, NON_JSON_AUTH_RESPONSES, NOT_FOUND, ReaderRole, SchedulerDep
from ...errors import StoreUnavailable
from ..metrics import CONTENT_TYPE
from ...core.observability import group_view, stats_view

router = APIRouter(tags=["operator"])


@router.get("/groups/{group_id}", response_model=GroupOut, dependencies=[ReaderRole],
            responses={**AUTH_RESPONSES, **NOT_FOUND})
async def get_group(group_id: Identifier, scheduler: SchedulerDep) -> GroupOut:
    """One group's state, counts, thresholds and rollouts."""
    return await group_view(scheduler.store, group_id)


@router.get("/stats", response_model=StatsResponse, dependencies=[ReaderRole],
            responses=AUTH_RESPONSES)
async def stats(scheduler: SchedulerDep) -> StatsResponse:
    """Counters, derived efficiency, queues, workers, recent batches and the strategies."""
    return await stats_view(scheduler.store, scheduler.settings, scheduler.clock(),
                            scheduler.auto, await scheduler.strategy_stats())


@router.get("/metrics", response_class=PlainTextResponse, dependencies=[ReaderRole],
            responses=NON_JSON_AUTH_RESPONSES)
async def metrics(scheduler: SchedulerDep, request: Request) -> Response:
    """The same figures in Prometheus text format, with per-route HTTP request counts and
    latencies and the process's metrics."""
    view = await stats_view(scheduler.store, scheduler.settings, scheduler.clock(),
                            scheduler.auto)
    return Response(request.app.state.metrics.render(view), media_type=CONTENT_TYPE)


@router.get("/healthz", response_model=HealthResponse,
            responses={503: {"model": HealthResponse,
                             "description": "Restart this process: Redis gone too long"}})
async def healthz(request: Request):
    """Liveness: 200 while the process is worth keeping; 503 once Redis has been unreachable
    longer than SARA_REDIS_DOWN_LIMIT_S, or its embedded Redis could not be restarted."""
    problem = request.app.state.redis_health.liveness_problem()
    if problem is None:
        return HealthResponse(status="ok")
    body = HealthResponse(status="unavailable", redis=False, detail=problem)
    return JSONResponse(body.model_dump(exclude_none=True), status_code=503)


@router.get("/readyz", response_model=HealthResponse,
            responses={503: {"model": HealthResponse, "description": "Redis unreachable"}})
async def readyz(scheduler: SchedulerDep, request: Request):
    """Readiness: Redis answers."""
    try:
        ok = await scheduler.store.run.ping()
    except StoreUnavailable:
        ok = False
    request.app.state.redis_health.observe(ok)
    body = HealthResponse(status="ok" if ok else "unavailable", redis=ok,
                          namespace=scheduler.settings.namespace)
    return body if ok else JSONResponse(body.model_dump(exclude_none=True), status_code=503)
