"""Run control over HTTP: listing, disabling and deleting prompts, pausing, resuming and
draining a run, roles and the error envelope, and the run state in /stats."""

from __future__ import annotations

import pytest

from .conftest import prompt_spec, result_for
from .test_auth import SETTINGS, bearer

pytestmark = pytest.mark.anyio


async def run(api, action: str) -> dict:
    return await api.ok("POST", "/run", {"action": action})


async def test_listing_pages_through_every_prompt_with_posteriors(api):
    await api.add(*[prompt_spec(f"p{i}", "mixed") for i in range(5)])
    await api.ok("PATCH", "/prompts/p2", {"enabled": False})
    seen, cursor = {}, 0
    for _ in range(10):
        page = await api.ok("GET", f"/prompts?limit=2&cursor={cursor}")
        seen.update({p["id"]: p for p in page["prompts"]})
        if page["next_cursor"] is None:
            break
        cursor = page["next_cursor"]
    assert sorted(seen) == [f"p{i}" for i in range(5)]
    assert seen["p2"]["state"] == "disabled" and seen["p1"]["state"] == "enabled"
    assert seen["p1"]["posterior"]["alpha"] == 1.0 and seen["p1"]["history"]["groups"] == 0


async def test_listing_shows_a_chat_prompt_as_its_messages(api):
    # the listing's model once took only text: one chat prompt made GET /prompts a 500
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    await api.ok("POST", "/prompts", {"prompts": [{"id": "chat", "prompt": messages}]})
    page = await api.ok("GET", "/prompts")
    (listed,) = [p for p in page["prompts"] if p["id"] == "chat"]
    assert listed["prompt"] == messages


async def test_a_disabled_prompt_is_not_opened_until_enabled(api):
    await api.add(prompt_spec("only", "mixed"))
    assert await api.ok("PATCH", "/prompts/only", {"enabled": False}) == {
        "id": "only", "state": "disabled"}
    assert (await api.lease("w1", 8))["rollouts"] == []
    await api.ok("PATCH", "/prompts/only", {"enabled": True})
    assert len((await api.lease("w1", 8))["rollouts"]) > 0


async def test_deleted_prompt_is_gone_but_its_group_in_flight_is_delivered(api):
    await api.add(prompt_spec("a", "mixed"))
    lease = await api.lease("w1", 8)
    assert await api.ok("DELETE", "/prompts/a") == {"id": "a", "state": "deleted"}
    assert (await api.get("/prompts/a")).status_code == 404
    await api.report("w1", [result_for(r) for r in lease["rollouts"]])
    await api.work("w1", 8)
    batch = (await api.next_batch(size=1)).json()
    assert batch["groups"][0]["prompt"] == "question a"
    r = await api.http.delete("/prompts/a")
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_prompt"


async def test_pause_gives_empty_leases_keeps_results_and_batches(api):
    await api.add(*[prompt_spec(f"m{i}", "mixed") for i in range(4)])
    first = await api.lease("w1", 8)
    await api.report("w1", [result_for(r) for r in first["rollouts"]])
    lease = await api.lease("w1", 8)  # the committed groups' remaining rollouts
    assert (await run(api, "pause"))["state"] == "paused"
    assert (await api.stats())["run_state"] == "paused"
    assert (await api.lease("w2", 8))["rollouts"] == []
    out = await api.report("w1", [result_for(r) for r in lease["rollouts"]])
    assert out["accepted"] == len(lease["rollouts"]) > 0
    assert (await api.next_batch(size=1)).status_code == 200  # ready groups still form batches
    assert (await api.ok("GET", "/run"))["state"] == "paused"
    assert (await run(api, "resume"))["state"] == "running"
    assert (await api.lease("w2", 8))["rollouts"]


async def test_drain_finishes_in_flight_work_then_reports_drained(api):
    await api.add(*[prompt_spec(f"m{i}", "mixed") for i in range(4)])
    lease = await api.lease("w1", 8)
    assert (await run(api, "drain"))["state"] == "draining"
    await api.report("w1", [result_for(r) for r in lease["rollouts"]])
    await api.work("w1", 8)
    opened = (await api.counters())["groups_opened"]
    for _ in range(5):
        r = await api.next_batch(size=64)
        if r.status_code != 200:
            break
        await api.ok("POST", f"/batches/{r.json()['batch_id']}/ack")
    assert (await api.ok("GET", "/run"))["state"] == "drained"
    assert (await api.stats())["run_state"] == "drained"
    assert (await api.counters())["groups_opened"] == opened


async def test_bad_requests_use_the_error_envelope(api):
    for method, path, body in [("POST", "/run", {"action": "stop"}),
                               ("POST", "/run", {"action": "pause", "extra": 1}),
                               ("PATCH", "/prompts/x", {"enabled": False, "why": "x"}),
                               ("GET", "/prompts?limit=0", None),
                               ("GET", f"/prompts?cursor={2**64}", None)]:
        r = await api.http.request(method, path, json=body)
        assert r.status_code == 422, (path, r.text)
        assert "error" in r.json()


@pytest.mark.parametrize("role, method, path, body, status", [
    ("operator", "GET", "/prompts", None, 200),
    ("operator", "GET", "/run", None, 200),
    ("trainer", "GET", "/prompts", None, 403),
    ("worker", "GET", "/run", None, 200),    # a worker that finds no work asks why
    ("trainer", "GET", "/run", None, 200),
    ("worker", "DELETE", "/workers/w1", None, 200),   # a worker leaving the run
    ("trainer", "DELETE", "/workers/w1", None, 403),
    ("operator", "DELETE", "/workers/w1", None, 403),
    ("operator", "POST", "/run", {"action": "pause"}, 403),
    ("operator", "PATCH", "/prompts/p", {"enabled": False}, 403),
    ("operator", "DELETE", "/prompts/p", None, 403),
    ("admin", "POST", "/run", {"action": "pause"}, 200),
    ("admin", "PATCH", "/prompts/p", {"enabled": False}, 200),
])
async def test_listing_needs_operator_and_changes_need_admin(make_api, role, method, path,
                                                             body, status):
    api = await make_api(**SETTINGS)
    await api.http.post("/prompts", json={"prompts": [{"id": "p", "prompt": "x"}]},
                        headers=bearer("admin"))
    r = await api.http.request(method, path, json=body, headers=bearer(role))
    assert r.status_code == status, r.text
    assert (await api.http.get("/run")).status_code == 401


async def test_sync_and_async_sdk_drive_run_control(api):
    import httpx

    from sara_client import NotFoundError, SaraClient

    from .conftest import BASE_URL, sdk_for

    await api.add(*[prompt_spec(f"s{i}", "mixed") for i in range(3)])
    async with sdk_for(api.app) as client:
        assert (await client.set_prompt_enabled("s1", False)).state == "disabled"
        listed = {p.id: p.state async for p in client.iter_prompts(page_size=1)}
        assert listed == {"s0": "enabled", "s1": "disabled", "s2": "enabled"}
        assert (await client.delete_prompt("s2")).state == "deleted"
        with pytest.raises(NotFoundError):
            await client.delete_prompt("s2")
        assert (await client.control_run("drain")).state == "drained"  # nothing was in flight
        assert (await client.control_run("pause")).state == "paused"
        assert (await client.run_status()).state == "paused"
    # the sync client builds the same calls; check them against a recorded exchange
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, request.url.query, request.content))
        if request.url.path == "/run":
            return httpx.Response(200, json={"namespace": "n", "state": "running"})
        if request.method == "GET":
            return httpx.Response(200, json={"prompts": [], "next_cursor": None})
        return httpx.Response(200, json={"id": "a/b", "state": "disabled"})

    with SaraClient(BASE_URL, transport=httpx.MockTransport(handler)) as sync:
        assert sync.control_run("resume").state == "running"
        assert list(sync.iter_prompts()) == []
        assert sync.set_prompt_enabled("a/b", False).state == "disabled"
    assert seen[0][:2] == ("POST", "/run") and b'"resume"' in seen[0][3]
    assert seen[1][2] == b"cursor=0&limit=100"
    assert seen[2][:2] == ("PATCH", "/prompts/a/b") and b"false" in seen[2][3]
