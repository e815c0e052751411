"""Validation, size limits and unknown ids: clear 4xx envelopes, never a 500, nothing applied."""

from __future__ import annotations

import pytest

from sara_client import MAX_COMPLETION_CHARS, MAX_PROMPT_CHARS, MAX_RESULTS_PER_CALL

from .conftest import prompt_spec, result_for, sdk_for

pytestmark = pytest.mark.anyio


def assert_envelope(r, status, code):
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "detail"}
    assert body["error"]["code"] == code and body["error"]["message"]
    return body["error"]


@pytest.mark.parametrize("path, body, field", [
    ("/results", {"worker_id": "w1", "results": [{"rollout_id": "g:0", "reward": "high"}]},
     "body.results.0.reward"),
    ("/results", {"worker_id": "w1", "results": [{"rollout_id": "g:0"}]}, "body.results.0.reward"),
    ("/results", {"worker_id": "w1", "results": [{"rollout_id": "g:0", "reward": 2e6}]},
     "body.results.0.reward"),
    ("/results", {"worker_id": "w1", "results": [{"rollout_id": "g:0", "reward": 1,
                                                   "completion_tokens": -1}]},
     "body.results.0.completion_tokens"),
    ("/results", {"worker_id": "w1", "results": []}, "body.results"),
    ("/results", {"results": [{"rollout_id": "g:0", "reward": 1}]}, "body.worker_id"),
    ("/leases", {"worker_id": "w1", "max_rollouts": 0}, "body.max_rollouts"),
    ("/leases", {"worker_id": "w1", "max_rollouts": 4097}, "body.max_rollouts"),
    ("/leases", {"worker_id": "w1", "wait_s": 61}, "body.wait_s"),
    ("/leases", {"worker_id": "bad id!"}, "body.worker_id"),
    ("/batches/next", {"size": 0}, "body.size"),
])
async def test_malformed_body_is_422_naming_the_field(api, path, body, field):
    err = assert_envelope(await api.post(path, body), 422, "invalid_request")
    assert err["message"].startswith(field + ":"), err["message"]
    assert err["detail"][0]["field"] == field and err["detail"][0]["problem"]


@pytest.mark.parametrize("path, body, field", [
    ("/leases", {"worker_id": "w1", "max_rolouts": 4}, "body.max_rolouts"),
    ("/results", {"worker_id": "w1", "results": [{"rollout_id": "g:0", "reward": 1,
                                                   "rewrd": 1}]}, "body.results.0.rewrd"),
    ("/batches/next", {"wait_s": 0, "sise": 3}, "body.sise"),
])
async def test_unknown_extra_field_is_422(api, path, body, field):
    err = assert_envelope(await api.post(path, body), 422, "invalid_request")
    assert err["message"].startswith(field), err["message"]


async def test_several_errors_are_all_listed(api):
    r = await api.post("/leases", {"worker_id": "", "max_rollouts": -1, "wait_s": -1})
    err = assert_envelope(r, 422, "invalid_request")
    assert len(err["detail"]) == 3 and "(and 2 more)" in err["message"]


async def test_invalid_json_and_bad_path_ids_are_422(api):
    r = await api.post("/leases", content=b"{not json", headers={"content-type": "application/json"})
    assert_envelope(r, 422, "invalid_request")
    # /results parses its own body (routers.json_body): the same envelope, the field named
    for body in (b"{not json", b"", b"\xff\xfe", b"[]"):
        r = await api.post("/results", content=body, headers={"content-type": "application/json"})
        assert assert_envelope(r, 422, "invalid_request")["message"].startswith("body")
    r = await api.post("/leases/bad%20id/heartbeat", {"worker_id": "w1"})
    assert assert_envelope(r, 422, "invalid_request")["message"].startswith("path.lease_id")


async def test_content_limits_are_422(api):
    r = await api.post("/prompts", {"prompts": [{"prompt": "x" * (MAX_PROMPT_CHARS + 1)}]})
    assert assert_envelope(r, 422, "invalid_request")["message"].startswith(
        "body.prompts.0.prompt")
    r = await api.post("/results", {"worker_id": "w1", "results": [
        {"rollout_id": "g:0", "reward": 1, "completion": "y" * (MAX_COMPLETION_CHARS + 1)}]})
    assert assert_envelope(r, 422, "invalid_request")["message"].startswith(
        "body.results.0.completion")
    many = [{"rollout_id": f"g:{i}", "reward": 0} for i in range(MAX_RESULTS_PER_CALL + 1)]
    r = await api.post("/results", {"worker_id": "w1", "results": many})
    assert assert_envelope(r, 422, "invalid_request")["message"].startswith("body.results")


async def test_unknown_route_and_method_use_the_envelope(api):
    assert_envelope(await api.get("/nope"), 404, "not_found")
    assert_envelope(await api.get("/leases"), 405, "method_not_allowed")


async def test_body_over_max_body_bytes_is_413(make_api):
    api = await make_api(max_body_bytes=2048)
    r = await api.post("/prompts", {"prompts": [{"id": "big", "prompt": "x" * 3000}]})
    err = assert_envelope(r, 413, "payload_too_large")
    assert "2048" in err["message"]
    assert (await api.get("/prompts/big")).status_code == 404
    small = await api.post("/prompts", {"prompts": [{"id": "small", "prompt": "x" * 100}]})
    assert small.status_code == 200


async def test_streamed_body_over_max_body_bytes_is_413(make_api):
    api = await make_api(max_body_bytes=2048)

    async def chunks():
        yield b'{"prompts": [{"id": "big", "prompt": "'
        for _ in range(4):
            yield b"x" * 1000
        yield b'"}]}'

    r = await api.post("/prompts", content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers
    assert_envelope(r, 413, "payload_too_large")


@pytest.mark.parametrize("bad", ["g-nope:0", "no-slot-here", "SLOT:x"])
async def test_unknown_rollout_id_is_404_and_nothing_is_applied(api, bad):
    await api.add(prompt_spec("f", "fail"))
    rs = (await api.lease("w1", 4))["rollouts"]
    gid = rs[0]["group_id"]
    before = (await api.counters(), await api.group(gid), await api.prompt("f"))
    r = await api.post("/results", {"worker_id": "w1",
                                    "results": [result_for(x) for x in rs] + [
                                        {"rollout_id": bad, "reward": 0}]})
    err = assert_envelope(r, 404, "unknown_rollout")
    assert err["detail"] == {"unknown_rollout_ids": [bad]}
    assert bad in err["message"]
    after = (await api.counters(), await api.group(gid), await api.prompt("f"))
    assert after == before


async def test_slot_beyond_issued_is_unknown(api):
    await api.add(prompt_spec("f", "fail"))
    gid = (await api.lease("w1", 4))["rollouts"][0]["group_id"]
    r = await api.post("/results", {"worker_id": "w1",
                                    "results": [{"rollout_id": f"{gid}:5", "reward": 0}]})
    assert assert_envelope(r, 404, "unknown_rollout")["detail"] == \
        {"unknown_rollout_ids": [f"{gid}:5"]}


async def test_sdk_report_drops_unknown_ids_and_resends_the_rest(api):
    await api.add(prompt_spec("f", "fail"))
    rs = (await api.lease("w1", 4))["rollouts"]
    async with sdk_for(api.app) as sara:
        out = await sara.report("w1", [result_for(rs[0]), {"rollout_id": "g-nope:1", "reward": 1},
                                       result_for(rs[1])])
        assert out.accepted == 2 and out.unknown_rollout_ids == ["g-nope:1"]
        assert [d.decision for d in out.decisions] == ["continue"]
        only_bad = await sara.report("w1", [{"rollout_id": "g-nope:2", "reward": 1}])
        assert only_bad.accepted == 0 and only_bad.unknown_rollout_ids == ["g-nope:2"]
    assert (await api.counters())["rollouts_completed"] == 2


async def test_an_unexpected_error_is_a_500_envelope_and_is_not_re_raised(make_app, monkeypatch):
    """Starlette's server-error handler answers and then re-raises, which makes
    uvicorn close the keep-alive connection; the app now answers and stops there."""
    import httpx

    app = make_app()

    async def broken() -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(app.state.scheduler.store.policy, "get_policy", broken)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),  # re-raises app errors
                                 base_url="http://test") as http:
        r = await http.get("/policy")
        err = assert_envelope(r, 500, "internal")
        assert "RuntimeError" in err["message"] and "boom" not in err["message"]
        assert (await http.get("/healthz")).status_code == 200
