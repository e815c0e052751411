"""Versioned leases: a lease may state the policy version the worker's weights hold; one older
than the current version minus max_staleness gets 409 stale_weights naming the version and
checkpoint to load, and nothing is leased. The SDK raises StaleWeightsError; `sara worker`'s loop
reloads and leases again. Results carry the version generation started and ended at."""

from __future__ import annotations

import pytest

from sara_client import ConflictError, StaleWeightsError
from sara_worker.loop import WorkerLoop
from tests.api.conftest import prompt_spec, result_for, sdk_for
from tests.api.test_worker_loop import RecordingSim, config, sim_prompts

pytestmark = pytest.mark.anyio


async def _publish(api, *versions: int) -> None:
    for v in versions:
        r = await api.publish(v, f"/ckpt/v{v}")
        assert r.status_code == 200, r.text


async def _lease(api, version: int | None):
    body = {"worker_id": "w1", "max_rollouts": 4, "wait_s": 0}
    if version is not None:
        body["policy_version"] = version
    return await api.post("/leases", body)


async def test_weights_older_than_max_staleness_get_409_naming_what_to_load(make_api):
    api = await make_api(max_staleness=1)
    await api.add(*(prompt_spec(f"p{i}", "mixed") for i in range(4)))
    await _publish(api, 1, 2, 3)
    r = await _lease(api, 1)  # oldest accepted: 3 - 1 = 2
    assert r.status_code == 409
    error = r.json()["error"]
    assert error["code"] == "stale_weights"
    assert error["detail"] == {"current_version": 3, "checkpoint": "/ckpt/v3",
                               "policy_version": 1, "max_staleness": 1}
    assert (await api.stats())["queues"]["leased"] == 0  # the refused call leased nothing
    for ok in (2, 3, None):  # within max_staleness, current, or not stated: leased
        r = await _lease(api, ok)
        assert r.status_code == 200 and r.json()["rollouts"], (ok, r.text)


async def test_max_staleness_zero_accepts_only_the_current_version(make_api):
    api = await make_api(max_staleness=0)
    await api.add(prompt_spec("p0", "mixed"))
    await _publish(api, 1)
    assert (await _lease(api, 0)).status_code == 409
    assert (await _lease(api, 1)).status_code == 200


async def test_the_sdk_raises_stale_weights_with_version_and_checkpoint(make_api):
    api = await make_api(max_staleness=1)
    await api.add(prompt_spec("p0", "mixed"))
    await _publish(api, 1, 2, 3, 4)
    client = sdk_for(api.app)
    try:
        with pytest.raises(StaleWeightsError) as caught:
            await client.lease("w1", 4, policy_version=2)
        assert isinstance(caught.value, ConflictError) and not caught.value.retryable
        assert (caught.value.current_version, caught.value.checkpoint) == (4, "/ckpt/v4")
        assert (await client.lease("w1", 4, policy_version=4)).rollouts
    finally:
        await client.aclose()


async def test_results_carry_the_start_and_end_versions_into_the_batch(make_api):
    api = await make_api(policy="uniform", group_size=2, batch_size=1, max_staleness=1)
    await api.add(prompt_spec("p0", "mixed"))
    await _publish(api, 1)
    lease = await api.lease("w1", 2)
    await api.report("w1", [result_for(r, policy_version=1, policy_version_end=2)
                            for r in lease["rollouts"]])
    await _publish(api, 2)
    r = await api.next_batch()
    assert r.status_code == 200, r.text
    (group,) = r.json()["groups"]
    assert {(ro["policy_version"], ro["policy_version_end"]) for ro in group["rollouts"]} == \
        {(1, 2)}


async def test_a_stale_worker_reloads_then_leases_and_reports_at_the_new_version(make_api):
    api = await make_api(policy="uniform", group_size=4, batch_size=1, max_staleness=1)
    await api.add(*sim_prompts(4))
    await _publish(api, 1, 2, 3)
    backend = RecordingSim(seed=0)
    client = sdk_for(api.app)
    loop = WorkerLoop(client, backend, config("w1", max_rollouts=4))  # starts at version 0
    try:
        counters = await loop.run()
    finally:
        await client.aclose()
    assert counters.stale_refusals == 1 and counters.policy_loads == 1
    loads = [e for e in backend.events if e[0] == "load"]
    assert loads == [("load", 3, "/ckpt/v3")]
    assert backend.events.index(loads[0]) == 0  # loaded before it generated anything
    assert set(backend.generated().values()) == {3}
    r = await api.next_batch()
    assert r.status_code == 200, r.text
    rollouts = r.json()["groups"][0]["rollouts"]
    assert {(ro["policy_version"], ro["policy_version_end"]) for ro in rollouts} == {(3, 3)}
