"""The scheduler inside your own process: SARA's allocation for a training loop you already have.

    with sara_client.local(group_size=8, batch_size=16) as sara:
        sara.add_prompts(prompts)
        lease = sara.lease("me", max_rollouts=64)
        ...                                   # generate and score with your own model
        sara.report("me", results)
        batch = sara.next_batch()

`local()` runs the very same FastAPI app and Lua scripts as `sara serve`, on an embedded Redis,
and hands back the ordinary `SaraClient`: requests go to the app through an in-process transport,
with no port opened. The app runs on an event loop in a background thread so the synchronous
client can be called from plain training code. `alocal()` is the asyncio twin.

This module imports the service lazily: the client package itself needs only httpx and pydantic,
while `local()` needs the `service` extra.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
from pathlib import Path
from typing import Any, AsyncIterator, Coroutine, Iterator, TypeVar

import httpx

from ._async import AsyncSaraClient
from ._sync import SaraClient

LOCAL_BASE_URL = "http://sara.local"
T = TypeVar("T")


def run_on_loop(awaitable: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop) -> T:
    """Run `awaitable` on `loop`, which runs in another thread, and block until its result: the
    one sync-over-async bridge (`local()`'s transport and lifespan, :class:`BlockingClient`)."""
    return asyncio.run_coroutine_threadsafe(awaitable, loop).result()


class BlockingClient:
    """Blocking calls to an `AsyncSaraClient` that lives on `loop` (another thread's): each
    method runs there through :func:`run_on_loop`. A training thread can share the in-process
    scheduler of an `alocal()` whose event loop also runs workers (``sara demo`` does)."""

    def __init__(self, client: AsyncSaraClient, loop: asyncio.AbstractEventLoop) -> None:
        self._client, self._loop = client, loop

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return run_on_loop(method(*args, **kwargs), self._loop)

        return call


class _LoopThreadTransport(httpx.BaseTransport):
    """A sync transport that runs each request through an ASGI app on another thread's loop."""

    def __init__(self, app: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._inner = httpx.ASGITransport(app=app)
        self._loop = loop

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()

        async def call() -> tuple[int, list, bytes]:
            forwarded = httpx.Request(request.method, request.url, headers=request.headers,
                                      content=body)
            response = await self._inner.handle_async_request(forwarded)
            content = await response.aread()
            return response.status_code, list(response.headers.raw), content

        status, headers, content = run_on_loop(call(), self._loop)
        return httpx.Response(status, headers=headers, content=content, request=request)


def _build_app(data_dir: str | Path | None, overrides: dict[str, Any]):
    try:
        from sara_service.http.app import create_app
        from sara_service.embedded import EmbeddedRedis
        from sara_service.settings import Settings
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError("sara_client.local() runs the scheduler in-process and needs the "
                          "service extra: pip install 'sara-rollout[service]'") from exc
    settings = Settings(**overrides)
    redis = None
    if settings.redis_url is None:
        folder = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="sara-local-"))
        redis = EmbeddedRedis(folder).start()
        settings = settings.on_embedded_redis(redis.url)
    return create_app(settings), redis


@contextlib.asynccontextmanager
async def alocal(data_dir: str | Path | None = None, **settings: Any
                 ) -> AsyncIterator[AsyncSaraClient]:
    """Async twin of `local()`: the app runs on the caller's own event loop."""
    app, redis = _build_app(data_dir, settings)
    try:
        async with app.router.lifespan_context(app):
            async with AsyncSaraClient(LOCAL_BASE_URL,
                                       transport=httpx.ASGITransport(app=app)) as client:
                yield client
    finally:
        if redis is not None:
            redis.stop()


@contextlib.contextmanager
def local(data_dir: str | Path | None = None, **settings: Any) -> Iterator[SaraClient]:
    """Start the scheduler in this process; yields a `SaraClient` wired to it.

    Keyword arguments are scheduler settings (`group_size`, `tau_low`, `policy`, ...). Without
    `redis_url`, an embedded Redis runs in `data_dir` (a temporary folder if unset).
    """
    app, redis = _build_app(data_dir, settings)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="sara-local", daemon=True)
    thread.start()
    lifespan = app.router.lifespan_context(app)
    try:
        run_on_loop(lifespan.__aenter__(), loop)
        try:
            with SaraClient(LOCAL_BASE_URL, transport=_LoopThreadTransport(app, loop)) as client:
                yield client
        finally:
            run_on_loop(lifespan.__aexit__(None, None, None), loop)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()
        if redis is not None:
            redis.stop()
