"""Redis unreachable: 503 store_unavailable with Retry-After, never a 500; the SDK retries."""

from __future__ import annotations

import httpx
import pytest

from sara_client import AsyncSaraClient, ServiceUnavailableError
from sara_service.http.app import create_app
from sara_service.settings import Settings

from .conftest import BASE_URL

pytestmark = pytest.mark.anyio

DOWN_URL = "redis://127.0.0.1:1"  # nothing listens on port 1


@pytest.fixture
async def down(fake_clock):
    app = create_app(Settings(redis_url=DOWN_URL), clock=fake_clock)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url=BASE_URL) as http:
        yield app, http
    await app.state.scheduler.store.redis.aclose()


@pytest.mark.parametrize("method, path, body", [
    ("POST", "/leases", {"worker_id": "w1", "max_rollouts": 4, "wait_s": 0}),
    ("POST", "/results", {"worker_id": "w1", "results": [{"rollout_id": "g1:0", "reward": 1}]}),
    ("POST", "/leases/l1/heartbeat", {"worker_id": "w1"}),
    ("POST", "/prompts", {"prompts": [{"prompt": "x"}]}),
    ("GET", "/prompts/p1", None),
    ("POST", "/batches/next", {"wait_s": 0}),
    ("POST", "/batches/b1/ack", None),
    ("GET", "/policy", None),
    ("POST", "/policy", {"version": 1}),
    ("GET", "/groups/g1", None),
    ("GET", "/stats", None),
    ("GET", "/metrics", None),
])
async def test_every_store_route_answers_503(down, method, path, body):
    _, http = down
    r = await http.request(method, path, json=body)
    assert r.status_code == 503, r.text
    assert r.headers["Retry-After"] == "1"
    err = r.json()["error"]
    assert err["code"] == "store_unavailable" and "Redis" in err["message"]


async def test_readyz_is_503_and_healthz_200(down):
    _, http = down
    r = await http.get("/readyz")
    assert r.status_code == 503
    assert r.json() == {"status": "unavailable", "redis": False, "namespace": "default"}
    assert (await http.get("/healthz")).status_code == 200


async def test_invalid_body_is_still_422_not_503(down):
    _, http = down
    r = await http.post("/leases", json={"worker_id": "w1", "max_rollouts": 0})
    assert r.status_code == 422


class Counting(httpx.AsyncBaseTransport):
    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner, self.calls = inner, 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        return await self.inner.handle_async_request(request)


async def test_sdk_retries_503_then_raises(down):
    app, _ = down
    transport = Counting(httpx.ASGITransport(app=app))
    slept: list[float] = []
    async with AsyncSaraClient(base_url=BASE_URL, transport=transport, max_attempts=3,
                               sleep=slept.append) as sara:
        with pytest.raises(ServiceUnavailableError) as info:
            await sara.lease("w1", wait_s=0)
        assert transport.calls == 3 and slept == [1.0, 1.0]  # Retry-After: 1
        assert info.value.code == "store_unavailable" and info.value.retry_after == 1.0

        transport.calls, slept[:] = 0, []
        with pytest.raises(ServiceUnavailableError):
            await sara.report("w1", [{"rollout_id": "g1:0", "reward": 1.0}])
        assert transport.calls == 3 and len(slept) == 2

        transport.calls = 0
        ready = await sara.ready()  # a 503 from /readyz is an answer, not retried
        assert not ready and ready.redis is False and transport.calls == 1
