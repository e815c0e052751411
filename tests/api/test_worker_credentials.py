"""Per-worker credentials: with SARA_WORKER_SECRET set, a worker's token is
derived from the secret and its own id, and binds the token to that id: it cannot lease, report,
heartbeat or release as another worker."""

from __future__ import annotations

import pytest

from sara_service.http.credentials import worker_of, worker_token

from .conftest import prompt_spec, result_for

pytestmark = pytest.mark.anyio

SECRET = "s3cret-for-tests"


def as_worker(worker_id: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {worker_token(SECRET, worker_id)}"}


@pytest.fixture
async def bound(make_api):
    return await make_api(worker_secret=SECRET, admin_token="tok-admin")


def test_a_derived_token_names_its_worker_and_nothing_else():
    token = worker_token(SECRET, "host-1.pid:7")
    assert worker_of(SECRET, token) == "host-1.pid:7"
    assert worker_of("another secret", token) is None
    assert worker_of(SECRET, token.replace("host-1", "host-2")) is None
    assert worker_of(SECRET, "no-dot-at-all") is None


async def test_a_worker_can_only_touch_its_own_leases(bound):
    admin = {"Authorization": "Bearer tok-admin"}
    r = await bound.post("/prompts", {"prompts": [prompt_spec("m", "mixed")]}, headers=admin)
    assert r.status_code == 200, r.text
    lease = await bound.post("/leases", {"worker_id": "w1", "max_rollouts": 4, "wait_s": 0},
                             headers=as_worker("w1"))
    assert lease.status_code == 200, lease.text
    lease = lease.json()
    rollout = lease["rollouts"][0]
    attempts = [
        ("/leases", {"worker_id": "w1", "max_rollouts": 1, "wait_s": 0}),
        (f"/leases/{lease['lease_id']}/heartbeat", {"worker_id": "w1"}),
        ("/results", {"worker_id": "w1", "results": [result_for(rollout, reward=0.0)]}),
        ("/results", {"worker_id": "w1", "results": [
            result_for(rollout, reward=0.0, finish_reason="abort")]}),
    ]
    for path, body in attempts:  # w2's own token, claiming to be w1
        r = await bound.post(path, body, headers=as_worker("w2"))
        assert r.status_code == 403, (path, r.text)
        assert "w2" in r.json()["error"]["message"]
    view = await bound.get(f"/groups/{rollout['group_id']}", headers=admin)
    assert view.json()["done"] == 0  # nothing w2 sent was applied
    ok = await bound.post("/results", {"worker_id": "w1",
                                       "results": [result_for(rollout, reward=0.0)]},
                          headers=as_worker("w1"))
    assert ok.status_code == 200 and ok.json()["accepted"] == 1


async def test_a_bound_token_is_a_worker_token_only(bound):
    r = await bound.get("/stats", headers=as_worker("w1"))
    assert r.status_code == 403
    r = await bound.get("/stats", headers={"Authorization": "Bearer w1.deadbeef"})
    assert r.status_code == 401


async def test_a_result_for_a_rollout_another_worker_holds_is_ignored(bound):
    admin = {"Authorization": "Bearer tok-admin"}
    await bound.post("/prompts", {"prompts": [prompt_spec("m", "mixed")]}, headers=admin)
    lease = (await bound.post("/leases", {"worker_id": "w1", "max_rollouts": 4, "wait_s": 0},
                              headers=as_worker("w1"))).json()
    rollout = lease["rollouts"][0]
    stolen = await bound.post("/results", {"worker_id": "w2", "results": [
        result_for(rollout, reward=0.0)]}, headers=as_worker("w2"))
    assert stolen.status_code == 200, stolen.text
    assert (stolen.json()["accepted"], stolen.json()["duplicates"]) == (0, 1)
    own = await bound.post("/results", {"worker_id": "w1", "results": [
        result_for(rollout, reward=1.0)]}, headers=as_worker("w1"))
    assert (own.json()["accepted"], own.json()["cancel"]) == (1, [])
    view = (await bound.get(f"/groups/{rollout['group_id']}", headers=admin)).json()
    assert (view["done"], view["successes"]) == (1, 1)
