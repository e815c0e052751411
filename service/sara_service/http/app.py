"""The scheduler's FastAPI application: `create_app(settings)`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from typing import Any, AsyncIterator, Callable

import redis.asyncio as aioredis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from sara_client.models import ErrorEnvelope

from ..errors import SaraServiceError, StoreUnavailable
from .health import RedisHealth
from .metrics import Metrics, RequestMetrics
from ..store.redis_client import connect
from .routers import (
    add_body_schemas, batches, dashboard, leases, observe, policy, prompts, results, run,
)
from ..core.scheduler import Clock, Scheduler
from ..settings import Settings
from ..store.store import Store

log = logging.getLogger("sara.service")
MAINTENANCE_INTERVAL_S = 1.0


def _envelope(status: int, code: str, message: str, detail: Any = None,
              headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, "detail": detail}},
                        status_code=status, headers=headers)


def _field_path(loc: tuple) -> str:
    return ".".join(str(part) for part in loc)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(SaraServiceError)
    async def domain_error(_: Request, exc: SaraServiceError) -> JSONResponse:
        headers = None
        if isinstance(exc, StoreUnavailable):
            headers = {"Retry-After": str(exc.retry_after_s)}
        return _envelope(exc.status_code, exc.code, exc.message, exc.detail, headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"field": _field_path(e["loc"]), "problem": e["msg"]} for e in exc.errors()]
        first = errors[0] if errors else {"field": "body", "problem": "invalid"}
        message = f"{first['field']}: {first['problem']}"
        if len(errors) > 1:
            message += f" (and {len(errors) - 1} more)"
        return _envelope(422, "invalid_request", message, errors)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:  # FastAPI's body parser: undecodable bytes, not JSON at all
            return _envelope(422, "invalid_request", f"body: {exc.detail}; send UTF-8 JSON")
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _envelope(exc.status_code, code, str(exc.detail), None, exc.headers)



class InternalErrors:
    """Answer an unexpected exception with the 500 envelope, and stop there.

    Starlette's own server-error handler answers and then re-raises, and uvicorn closes the
    keep-alive connection of a request whose app raised: every client of a 500 would reconnect.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracking_send(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:  # noqa: BLE001 - logged, answered with the envelope
            log.exception("unhandled error")
            if started:  # half an answer is out: only closing the connection can end it
                raise
            response = _envelope(500, "internal", f"internal error: {type(exc).__name__}")
            await response(scope, receive, send)


class BodyLimit:
    """Answer 413 for a body larger than `limit` bytes, declared or streamed.

    A streamed body is read here first (never more than limit + 1 bytes) and replayed to the app:
    raising from inside the app's own body reader would surface as a 400 instead.
    """

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit():
            if int(declared) > self.limit:
                return await self._reject(send)
            return await self.app(scope, receive, send)
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return await self.app(scope, _replay([message]), send)
            chunks.append(message)
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
            if size > self.limit:
                return await self._reject(send)
        await self.app(scope, _replay(chunks), send)

    async def _reject(self, send: Any) -> None:
        body = json.dumps({"error": {"code": "payload_too_large",
                                     "message": f"request body over {self.limit} bytes; "
                                                "send fewer items per call", "detail": None}})
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body.encode()})


def _replay(messages: list[dict]) -> Any:
    pending = list(messages)

    async def receive() -> dict:
        if pending:
            return pending.pop(0)
        return {"type": "http.disconnect"}

    return receive


async def _maintenance_loop(scheduler: Scheduler, stop: asyncio.Event,
                            health: RedisHealth) -> None:
    # upkeep must outlive any one failure: a dead loop would stop lease expiry and GC for good
    while not stop.is_set():
        try:
            await scheduler.maintain()
            health.observe(True)
        except StoreUnavailable:
            health.observe(False)
        except Exception:  # noqa: BLE001 - logged, and tried again next interval
            log.exception("upkeep failed; retrying in %.0f s", MAINTENANCE_INTERVAL_S)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), MAINTENANCE_INTERVAL_S)


async def _stop_task(task: asyncio.Task, stop: asyncio.Event) -> None:
    """Stop the upkeep loop. redis-py can swallow a cancel that lands mid-command, so one
    cancel is not enough: the stop event ends it between rounds, and cancels repeat until done."""
    stop.set()
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)


def _answer_long_polls_on_signals(scheduler: Scheduler) -> Callable[[], None]:
    """Chain SIGTERM/SIGINT to `scheduler.begin_shutdown`; returns what restores the handlers.

    uvicorn, on SIGTERM, stops accepting and then waits for requests in flight: a long poll
    (a lease or /batches/next with wait_s up to a minute) would hold the process past any grace
    period. Answering them at once, empty, lets it exit in well under Docker's 10 s. Signals can
    only be set from the main thread; elsewhere (a test client's thread) nothing is chained.
    """
    saved: dict[int, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)

        def handler(signum: int, frame: Any, previous: Any = previous) -> None:
            scheduler.begin_shutdown()
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:  # what the signal would have done: end the process
                signal.signal(signum, signal.SIG_DFL)
                signal.raise_signal(signum)

        try:
            signal.signal(sig, handler)
        except ValueError:  # not the main thread
            break
        saved[sig] = previous

    def restore() -> None:
        for sig, previous in saved.items():
            signal.signal(sig, previous)

    return restore


def _lifespan(scheduler: Scheduler, health: RedisHealth, redis: aioredis.Redis) -> Callable:
    """The app's lifespan: upkeep runs while it serves; SIGTERM answers long polls at once; on
    the way out upkeep stops (bounded) and the Redis client closes."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # before serving: a format this release cannot read stops it here (UnknownFormat);
        # with Redis down, the upkeep loop checks it once Redis answers
        with contextlib.suppress(StoreUnavailable):
            await scheduler.check_format()
        stop = asyncio.Event()
        task = asyncio.create_task(_maintenance_loop(scheduler, stop, health))
        restore_signals = _answer_long_polls_on_signals(scheduler)
        try:
            yield
        finally:
            scheduler.begin_shutdown()
            restore_signals()
            await _stop_task(task, stop)
            await scheduler.wakeups.aclose()
            await redis.aclose()

    return lifespan


def _document_body_schemas(app: FastAPI) -> None:
    """Add to /openapi.json the schemas of the bodies routes parse themselves (`json_body`)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = add_body_schemas(build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(settings: Settings, *, redis: aioredis.Redis | None = None,
               clock: Clock | None = None, embedded: Any = None) -> FastAPI:
    """Build the scheduler app. `redis` defaults to a client for settings.redis_url;
    `embedded` is the supervised EmbeddedRedis behind it, if any (/healthz watches it)."""
    if redis is None:
        if not settings.redis_url:
            raise ValueError("settings.redis_url is unset: start an embedded Redis first "
                             "(`sara serve` does) or pass redis=")
        redis = connect(settings.redis_url, socket_timeout=5, socket_connect_timeout=2)
    scheduler = Scheduler(settings, Store(redis, settings.namespace), clock)
    health = RedisHealth(scheduler.clock, settings.redis_down_limit_s, embedded)

    lifespan = _lifespan(scheduler, health, redis)
    app = FastAPI(title="SARA rollout-allocation service", version="0.1.0", lifespan=lifespan,
                  responses={422: {"model": ErrorEnvelope, "description": "Invalid request: "
                                   "the message names the field"}},
                  description="Sequential adaptive rollout allocation for RL with verifiable "
                              "rewards: workers lease rollouts, the trainer pulls effective "
                              "batches.")
    app.state.settings = settings
    app.state.scheduler = scheduler
    app.state.redis_health = health
    for module in (prompts, run, leases, results, batches, policy, observe, dashboard):
        app.include_router(module.router)
    _document_body_schemas(app)
    _install_error_handlers(app)
    app.add_middleware(InternalErrors)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.state.metrics = Metrics()
    # added last, so outermost: it sees the status of every answer, 413s and 500s included
    app.add_middleware(RequestMetrics, metrics=app.state.metrics)
    return app
