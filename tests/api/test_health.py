"""/healthz and /readyz when Redis goes away: readiness fails at once,
liveness only once Redis has been unreachable longer than SARA_REDIS_DOWN_LIMIT_S (a restart of
this process is then worth trying), or at once when its embedded Redis could not be restarted.

Each test runs its own redis-server (EmbeddedRedis), stops it and starts it again on the same
port; the clock that measures the outage is the injected fake one.
"""

from __future__ import annotations

import httpx
import pytest

from sara_service.http.app import create_app
from sara_service.embedded import EmbeddedRedis
from sara_service.settings import Settings

from .conftest import BASE_URL

pytestmark = pytest.mark.anyio
LIMIT_S = 30.0


@pytest.fixture
def own_redis(tmp_path):
    server = EmbeddedRedis(tmp_path / "redis").start()
    yield server
    server.stop()


async def _client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE_URL)


async def test_liveness_fails_only_after_redis_was_gone_longer_than_the_limit(own_redis,
                                                                            fake_clock):
    app = create_app(Settings(redis_url=own_redis.url, redis_down_limit_s=LIMIT_S),
                     clock=fake_clock)
    async with await _client(app) as http:
        assert (await http.get("/readyz")).status_code == 200
        own_redis.stop()
        assert (await http.get("/readyz")).status_code == 503
        assert (await http.get("/healthz")).status_code == 200  # a blip is not a reason to restart
        fake_clock.advance(LIMIT_S + 1)
        assert (await http.get("/readyz")).status_code == 503
        dead = await http.get("/healthz")
        assert dead.status_code == 503, dead.text
        assert dead.json()["redis"] is False and "unreachable" in dead.json()["detail"]
        own_redis.start()  # same port, same data directory
        assert (await http.get("/readyz")).status_code == 200
        assert (await http.get("/healthz")).status_code == 200
    await app.state.scheduler.store.redis.aclose()


async def test_liveness_fails_at_once_when_the_embedded_redis_cannot_be_restarted(own_redis):
    class GaveUp:
        restart_failed = True

    app = create_app(Settings(redis_url=own_redis.url), embedded=GaveUp())
    async with await _client(app) as http:
        r = await http.get("/healthz")
        assert r.status_code == 503 and "could not be restarted" in r.json()["detail"]
    await app.state.scheduler.store.redis.aclose()
