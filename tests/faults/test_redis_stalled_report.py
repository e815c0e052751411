"""A /results call against a stalled Redis: the scheduler gives up on it
(503) but Redis applies it when it resumes. The SDK's retry carries the same report id, so it gets
that first call's answer, the cancel list it drained included, instead of "duplicates" and an
empty cancel list that no later call would ever deliver.

A real redis-server (EmbeddedRedis) is SIGSTOPped while `sara serve --redis-url` on it has
w1 owing cancels (w2 answered the rollouts w1 holds); the report is sent, the test waits until the scheduler has answered 503 at
least once (counted by the transport), then SIGCONTs Redis and lets the SDK's retries finish.
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid

import httpx
import pytest
from sara_service.embedded import EmbeddedRedis

from ._support import CountingTransport, poll_until, sdk_client, serve_process

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def _post(url: str, path: str, body: dict) -> dict:
    r = httpx.post(f"{url}{path}", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def _w1_owes_cancels(url: str) -> tuple[dict, list[str]]:
    """w2 answers the rollouts w1 holds first: w1 owes 4 cancels. Returns a rollout w1 holds of
    another group, and those ids."""
    _post(url, "/prompts", {"prompts": [{"id": "f", "prompt": "q f", "answer": "1"}]})
    held = _post(url, "/leases", {"worker_id": "w1", "max_rollouts": 4})["rollouts"]
    _post(url, "/prompts", {"prompts": [{"id": "m", "prompt": "q m", "answer": "1"}]})
    own = _post(url, "/leases", {"worker_id": "w1", "max_rollouts": 1})["rollouts"]
    _post(url, "/results", {"worker_id": "w2", "results": [
        {"rollout_id": r["rollout_id"], "reward": 0.0, "policy_version": 0} for r in held]})
    return own[0], sorted(r["rollout_id"] for r in held)


async def _report_through_a_stall(url: str, redis_pid: int, own: dict):
    transport = CountingTransport()
    client = sdk_client(url, transport=transport, max_attempts=50, max_delay_s=0.5)
    os.kill(redis_pid, signal.SIGSTOP)
    try:
        report = asyncio.create_task(client.report(
            "w1", [{"rollout_id": own["rollout_id"], "reward": 1.0, "policy_version": 0}]))
        await poll_until(lambda: transport.status[503] > 0 or report.done(), 30, "a 503")
    finally:
        os.kill(redis_pid, signal.SIGCONT)
    answer = await report
    await client.aclose()
    return answer, transport.status


def test_a_report_applied_after_its_503_still_delivers_its_cancels(tmp_path):
    store = EmbeddedRedis(tmp_path / "redis").start()
    server = serve_process(tmp_path, store.url, f"stall-{uuid.uuid4().hex[:8]}", "serve",
                           group_size=4, batch_size=4, seed=0)
    try:
        server.start()
        own, owed = _w1_owes_cancels(server.url)
        answer, status = asyncio.run(_report_through_a_stall(server.url, store.process.pid, own))
    finally:
        server.stop()
        store.stop()
        print(server.log_tail())
    assert status[503] >= 1, status
    assert sorted(answer.cancel) == owed, (answer, status)
    assert answer.duplicates == 0
