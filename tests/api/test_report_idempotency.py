"""Idempotent result reports: a /results call applied whose answer was lost
(a 503 or a timeout after Redis applied it) is retried with the same `report_id`, and the retry
gets the first call's answer, decisions and cancel list included, instead of "duplicates"."""

from __future__ import annotations

import httpx
import pytest

from sara_client import RetryPolicy

from .conftest import BASE_URL, prompt_spec, result_for, slot_of

pytestmark = pytest.mark.anyio


def _by_slot(rollouts: list[dict]) -> list[dict]:
    return sorted(rollouts, key=lambda r: slot_of(r["rollout_id"]))


async def _w1_owes_cancels(api) -> tuple[dict, list[str]]:
    """w1 holds re-issued copies that w2 answers first, so w1's next call carries their cancel
    ids; returns a rollout w1 holds of another group, to report, and those ids."""
    await api.add(prompt_spec("f", "fail"))
    old = _by_slot((await api.lease("w2", 4))["rollouts"])
    api.clock.advance(api.settings.lease_ttl_s + 1)
    assert len((await api.lease("w1", 4))["rollouts"]) == 4  # the copies, now w1's
    await api.add(prompt_spec("m", "mixed"))
    own = (await api.lease("w1", 1))["rollouts"][0]
    await api.report("w2", [result_for(r) for r in old])
    return own, sorted(r["rollout_id"] for r in old)


async def test_a_repeated_report_id_gets_the_first_answer_again(api):
    own, owed = await _w1_owes_cancels(api)
    body = {"worker_id": "w1", "report_id": "rep-1", "results": [result_for(own)]}
    first = await api.post("/results", body)
    again = await api.post("/results", body)
    assert again.status_code == 200, again.text
    assert first.json()["accepted"] == 1 and sorted(first.json()["cancel"]) == owed
    assert again.json() == first.json()  # decisions and cancels: the answer that was lost
    assert (await api.counters())["results_duplicate"] == 0  # the replay applied nothing


async def test_another_report_id_is_another_report(api):
    own, _ = await _w1_owes_cancels(api)
    await api.post("/results", {"worker_id": "w1", "report_id": "a", "results": [result_for(own)]})
    other = await api.post("/results", {"worker_id": "w1", "report_id": "b",
                                        "results": [result_for(own)]})
    assert (other.json()["duplicates"], other.json()["cancel"]) == (1, [])
    # the same id from another worker is that worker's own report
    mine = await api.post("/results", {"worker_id": "w7", "report_id": "a",
                                       "results": [result_for(own)]})
    assert mine.json()["duplicates"] == 1


class LoseFirstAnswer(httpx.AsyncBaseTransport):
    """Forwards every request to the app; the first /results answer is replaced by a 503, as
    when Redis applied the call after the scheduler gave up on it."""

    def __init__(self, app) -> None:
        self.inner = httpx.ASGITransport(app=app)
        self.bodies: list[bytes] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.url.path == "/results":
            self.bodies.append(request.content)
            if len(self.bodies) == 1:
                await response.aread()
                return httpx.Response(503, headers={"Retry-After": "0"}, json={"error": {
                    "code": "store_unavailable", "message": "stalled", "detail": None}})
        return response


async def test_the_sdk_retry_reuses_the_report_id_and_gets_the_cancels(api):
    from sara_client import AsyncSaraClient

    own, owed = await _w1_owes_cancels(api)
    transport = LoseFirstAnswer(api.app)
    async with AsyncSaraClient(BASE_URL, transport=transport,
                               retry=RetryPolicy(max_attempts=3, base_delay_s=0)) as client:
        answer = await client.report("w1", [result_for(own)])
    assert len(transport.bodies) == 2 and transport.bodies[0] == transport.bodies[1]
    assert sorted(answer.cancel) == owed
    assert (answer.accepted, answer.duplicates) == (1, 0)
