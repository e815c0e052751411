"""GET/POST /policy."""

from __future__ import annotations

import pytest

from sara_client import ConflictError

from .conftest import prompt_spec, sdk_for

pytestmark = pytest.mark.anyio


async def test_default_policy_is_version_0(api):
    assert await api.ok("GET", "/policy") == {"version": 0, "checkpoint": None}


async def test_publish_moves_forward_only(api):
    r = await api.publish(1, "ckpt-1")
    assert r.status_code == 200 and r.json() == {"version": 1, "checkpoint": "ckpt-1"}
    assert await api.ok("GET", "/policy") == {"version": 1, "checkpoint": "ckpt-1"}

    again = await api.publish(1, "other")
    assert again.status_code == 409
    err = again.json()["error"]
    assert err["code"] == "stale_policy_version" and "1" in err["message"]
    assert await api.ok("GET", "/policy") == {"version": 1, "checkpoint": "ckpt-1"}

    assert (await api.publish(5)).json() == {"version": 5, "checkpoint": None}
    assert (await api.publish(3)).status_code == 409
    assert await api.ok("GET", "/policy") == {"version": 5, "checkpoint": None}


@pytest.mark.parametrize("body", [{"version": 0}, {"version": -1}, {"checkpoint": "x"},
                                  {"version": 2, "ckpt": "x"}, {"version": "two"}])
async def test_invalid_publish_is_422(api, body):
    r = await api.post("/policy", body)
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
    assert (await api.ok("GET", "/policy"))["version"] == 0


async def test_leases_carry_the_current_policy(api):
    await api.add(prompt_spec("m", "mixed"))
    assert (await api.lease("w1", 1))["policy"] == {"version": 0, "checkpoint": None}
    await api.publish(1, "s3://ckpt/1")
    lease = await api.lease("w1", 1)
    assert lease["rollouts"] and lease["policy"] == {"version": 1, "checkpoint": "s3://ckpt/1"}
    await api.publish(2, "s3://ckpt/2")
    third = await api.lease("w2", 1)
    assert third["policy"] == {"version": 2, "checkpoint": "s3://ckpt/2"}


async def test_sdk_publish_and_conflict(api):
    async with sdk_for(api.app) as sara:
        assert (await sara.publish_policy(1, "c1")).version == 1
        assert (await sara.get_policy()).checkpoint == "c1"
        with pytest.raises(ConflictError) as info:
            await sara.publish_policy(1)
        assert info.value.status_code == 409 and info.value.code == "stale_policy_version"
