"""SIGTERM during long polls: `sara serve` answers every long poll at once,
empty (a lease with no rollouts, /batches/next 204), and exits well inside Docker's default 10 s
grace, instead of waiting out the polls' `wait_s`.

A worker's lease and a trainer's /batches/next, each with `wait_s: 60`, are sent to a `sara serve`
on a real Redis with nothing to do; the test waits until both are seen polling in Redis (the
worker's entry in the workers set; a form_batch call in MONITOR), then sends SIGTERM.
"""

from __future__ import annotations

import concurrent.futures
import time
import uuid

import httpx
import pytest
import redis
from sara_service.store.keys import Keys

from ._support import serve_process

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

GRACE_S = 10.0  # docker stop's default


def _long_poll(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=90)


def _wait_for_batch_poll(redis_url: str, keys: Keys, deadline_s: float) -> None:
    """Return once the scheduler runs form_batch (its keys name the batch window)."""
    client = redis.Redis.from_url(redis_url)
    try:
        with client.monitor() as monitor:
            end = time.monotonic() + deadline_s
            for event in monitor.listen():
                if keys.batch_window in event["command"]:
                    return
                assert time.monotonic() < end, "no /batches/next poll reached Redis"
    finally:
        client.close()


def _wait_for_worker(redis_url: str, keys: Keys, worker: str, deadline_s: float) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        end = time.monotonic() + deadline_s
        while client.zscore(keys.workers, worker) is None:
            assert time.monotonic() < end, "the lease never reached Redis"
            time.sleep(0.02)  # polling a condition with a deadline
    finally:
        client.close()


def test_sigterm_answers_long_polls_at_once_and_exits_within_the_grace(tmp_path, redis_url):
    namespace = f"shutdown-{uuid.uuid4().hex[:8]}"
    keys = Keys(namespace)
    server = serve_process(tmp_path, redis_url, namespace, "serve", group_size=4, batch_size=4,
                           seed=0)
    server.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            lease = pool.submit(_long_poll, server.url, "/leases",
                                {"worker_id": "w1", "max_rollouts": 1, "wait_s": 60})
            batch = pool.submit(_long_poll, server.url, "/batches/next", {"wait_s": 60})
            _wait_for_worker(redis_url, keys, "w1", 30)
            _wait_for_batch_poll(redis_url, keys, 30)
            started = time.monotonic()
            server.process.terminate()
            lease_answer = lease.result(timeout=GRACE_S)
            batch_answer = batch.result(timeout=GRACE_S)
            code = server.process.wait(timeout=GRACE_S)
            took = time.monotonic() - started
    finally:
        server.stop()
        print(server.log_tail())
    assert lease_answer.status_code == 200 and lease_answer.json()["rollouts"] == []
    assert batch_answer.status_code == 204
    assert code == 0
    assert took < 5.0, f"shutdown took {took:.1f}s"
