"""An external Redis gone for good: `sara serve`'s /healthz turns 503 once
Redis has been unreachable longer than SARA_REDIS_DOWN_LIMIT_S, so an orchestrator restarts the
process, and back to 200 when Redis returns. Only the upkeep loop observes Redis here (nobody calls
/readyz), which is how a liveness probe sees it in a deployment.
"""

from __future__ import annotations

import time
import uuid

import httpx
import pytest
from sara_service.embedded import EmbeddedRedis

from ._support import serve_process

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def _poll_status(url: str, status: int, deadline_s: float) -> httpx.Response:
    end = time.monotonic() + deadline_s
    while True:
        r = httpx.get(url, timeout=5)
        if r.status_code == status or time.monotonic() >= end:
            return r
        time.sleep(0.1)  # polling a condition with a deadline


def test_healthz_asks_for_a_restart_only_after_the_limit(tmp_path):
    store = EmbeddedRedis(tmp_path / "redis").start()
    server = serve_process(tmp_path, store.url, f"gone-{uuid.uuid4().hex[:8]}", "serve",
                           group_size=4, batch_size=4, seed=0, redis_down_limit_s=2)
    try:
        server.start()
        health = f"{server.url}/healthz"
        store.stop()
        went_down = time.monotonic()
        r = _poll_status(health, 503, 30)
        assert r.status_code == 503 and "unreachable" in r.json()["detail"], r.text
        assert time.monotonic() - went_down >= 2.0  # not before the limit
        store.start()  # same port, same data directory
        assert _poll_status(health, 200, 30).status_code == 200
    finally:
        server.stop()
        store.stop()
        print(server.log_tail())
