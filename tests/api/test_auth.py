"""Bearer-token roles: worker, trainer, operator (read-only), admin (everything)."""

from __future__ import annotations

import pytest

from sara_client import AuthenticationError, PermissionDeniedError

from .conftest import prompt_spec, result_for, sdk_for

pytestmark = pytest.mark.anyio

TOKENS = {"worker": "tok-worker", "trainer": "tok-trainer", "operator": "tok-operator",
          "admin": "tok-admin"}
SETTINGS = {f"{role}_token": token for role, token in TOKENS.items()}


def bearer(role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[role]}"}


async def call(api, method, path, role=None, json=None):
    headers = bearer(role) if role else {}
    return await api.http.request(method, path, json=json, headers=headers)


ROUTES = [
    ("POST", "/prompts", {"prompts": [{"id": "p", "prompt": "x"}]}),
    ("GET", "/prompts/p", None),
    ("POST", "/leases", {"worker_id": "w1", "max_rollouts": 1}),
    ("POST", "/results", {"worker_id": "w1", "results": [{"rollout_id": "g:0", "reward": 1}]}),
    ("POST", "/leases/l1/heartbeat", {"worker_id": "w1"}),
    ("POST", "/batches/next", {"wait_s": 0}),
    ("POST", "/batches/b1/ack", None),
    ("GET", "/policy", None),
    ("POST", "/policy", {"version": 1}),
    ("GET", "/groups/g1", None),
    ("GET", "/stats", None),
    ("GET", "/metrics", None),
]


@pytest.fixture
async def secured(make_api):
    return await make_api(**SETTINGS)


@pytest.mark.parametrize("method, path, body", ROUTES)
async def test_no_token_or_wrong_token_is_401(secured, method, path, body):
    for headers in ({}, {"Authorization": "Bearer not-a-token"},
                    {"Authorization": f"Basic {TOKENS['admin']}"}):
        r = await secured.http.request(method, path, json=body, headers=headers)
        assert r.status_code == 401, (headers, r.text)
        assert r.json()["error"]["code"] == "unauthorized"


@pytest.mark.parametrize("role, method, path, body", [
    ("worker", "POST", "/batches/next", {"wait_s": 0}),
    ("worker", "POST", "/batches/b1/ack", None),
    ("worker", "POST", "/policy", {"version": 1}),
    ("worker", "POST", "/prompts", {"prompts": [{"prompt": "x"}]}),
    ("worker", "GET", "/stats", None),
    ("trainer", "POST", "/leases", {"worker_id": "w1"}),
    ("trainer", "POST", "/results", {"worker_id": "w1",
                                     "results": [{"rollout_id": "g:0", "reward": 1}]}),
    ("trainer", "POST", "/prompts", {"prompts": [{"prompt": "x"}]}),
    ("operator", "POST", "/prompts", {"prompts": [{"prompt": "x"}]}),
    ("operator", "POST", "/leases", {"worker_id": "w1"}),
    ("operator", "POST", "/policy", {"version": 1}),
    ("operator", "POST", "/batches/next", {"wait_s": 0}),
])
async def test_role_may_not_call_route_is_403(secured, role, method, path, body):
    r = await call(secured, method, path, role, body)
    assert r.status_code == 403, r.text
    err = r.json()["error"]
    assert err["code"] == "forbidden" and role in err["message"]


async def test_auth_is_checked_before_the_body(secured):
    r = await call(secured, "POST", "/leases", None, {"worker_id": "bad id!", "max_rollouts": 0})
    assert r.status_code == 401
    r = await call(secured, "POST", "/leases", "trainer", {"worker_id": "bad id!"})
    assert r.status_code == 403


@pytest.mark.parametrize("role, method, path, body, status", [
    ("worker", "POST", "/leases", {"worker_id": "w1"}, 200),
    ("worker", "GET", "/policy", None, 200),
    ("worker", "POST", "/leases/l1/heartbeat", {"worker_id": "w1"}, 404),
    ("trainer", "POST", "/batches/next", {"wait_s": 0}, 204),
    ("trainer", "POST", "/policy", {"version": 1}, 200),
    ("trainer", "GET", "/stats", None, 200),
    ("operator", "GET", "/stats", None, 200),
    ("operator", "GET", "/metrics", None, 200),
    ("operator", "GET", "/policy", None, 200),
    ("operator", "GET", "/groups/g1", None, 404),
])
async def test_role_may_call_route(secured, role, method, path, body, status):
    r = await call(secured, method, path, role, body)
    assert r.status_code == status, r.text


async def test_admin_can_do_everything(secured):
    async def admin(method, path, json=None):
        return await call(secured, method, path, "admin", json)

    assert (await admin("POST", "/prompts", {"prompts": [prompt_spec("m", "mixed")]})).is_success
    assert (await admin("GET", "/prompts/m")).status_code == 200
    lease = (await admin("POST", "/leases", {"worker_id": "w1", "max_rollouts": 4})).json()
    assert len(lease["rollouts"]) == 4
    hb = await admin("POST", f"/leases/{lease['lease_id']}/heartbeat", {"worker_id": "w1"})
    assert hb.status_code == 200
    r = await admin("POST", "/results", {"worker_id": "w1",
                                         "results": [result_for(x) for x in lease["rollouts"]]})
    assert r.status_code == 200
    assert (await admin("GET", f"/groups/{lease['rollouts'][0]['group_id']}")).status_code == 200
    assert (await admin("POST", "/policy", {"version": 1})).status_code == 200
    assert (await admin("GET", "/policy")).status_code == 200
    assert (await admin("POST", "/batches/next", {"wait_s": 0})).status_code == 204
    assert (await admin("POST", "/batches/b1/ack")).status_code == 404
    for path in ("/stats", "/metrics", "/openapi.json"):
        assert (await admin("GET", path)).status_code == 200
    assert (await admin("GET", "/stats")).json()["config"]["auth_enabled"] is True


async def test_health_needs_no_token(secured):
    assert (await secured.get("/healthz")).json()["status"] == "ok"
    r = await secured.get("/readyz")
    assert r.status_code == 200 and r.json()["redis"] is True


async def test_with_no_tokens_everything_is_open(api):
    await api.add(prompt_spec("m", "mixed"))
    assert len((await api.lease("w1", 4))["rollouts"]) == 4
    assert (await api.publish(1)).status_code == 200
    assert (await api.next_batch()).status_code == 204
    assert (await api.get("/stats")).json()["config"]["auth_enabled"] is False
    assert (await api.get("/metrics")).status_code == 200


async def test_a_single_configured_token_closes_the_api(make_api):
    api = await make_api(admin_token="only-admin")
    assert (await api.get("/stats")).status_code == 401
    r = await api.get("/stats", headers={"Authorization": "Bearer only-admin"})
    assert r.status_code == 200


async def test_sdk_tokens(secured):
    async with sdk_for(secured.app, token=TOKENS["trainer"]) as trainer:
        assert await trainer.next_batch(wait_s=0) is None
        with pytest.raises(PermissionDeniedError):
            await trainer.lease("w1")
    async with sdk_for(secured.app, token="wrong") as stranger:
        with pytest.raises(AuthenticationError) as info:
            await stranger.stats()
        assert info.value.status_code == 401
