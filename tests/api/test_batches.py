"""POST /batches/next and /batches/{id}/ack: effective batches, redelivery, staleness, caps."""

from __future__ import annotations

import pytest

from .conftest import prompt_spec, result_for, sdk_for, slot_of

pytestmark = pytest.mark.anyio

SMALL = {"batch_size": 2, "prefetch_batches": 1}
PROMPTS = [prompt_spec("m1", "mixed"), prompt_spec("m2", "mixed"), prompt_spec("f1", "fail"),
           prompt_spec("s1", "success")]


async def ready_api(make_api, prompts=PROMPTS, **overrides):
    """An app whose worker has run until flow control stops it (batch_size groups ready)."""
    api = await make_api(**{**SMALL, **overrides})
    await api.add(*prompts)
    await api.work("w1", 8)
    return api


def rewards(group):
    return [r["reward"] for r in group["rollouts"]]


async def test_next_is_204_when_nothing_is_ready(api):
    r = await api.next_batch()
    assert r.status_code == 204 and r.content == b""
    bare = await api.post("/batches/next")  # the body is optional
    assert bare.status_code == 204


async def test_a_size_beyond_the_flow_target_is_refused_not_waited_on(make_api):
    api = await make_api(**{**SMALL, "prefetch_batches": 2})   # 4 groups ready or making
    r = await api.next_batch(size=5, wait_s=30)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "unfillable" and "SARA_BATCH_SIZE" in error["message"]
    assert error["detail"] == {"size": 5, "flow_target": 4}
    assert (await api.next_batch(size=4)).status_code == 204   # at the target: waits, then 204
    capped = await make_api(**SMALL, max_rollouts_per_batch=8)  # a cap ends batches early
    assert (await capped.next_batch(size=50)).status_code == 204


@pytest.mark.parametrize("policy", ["sara", "dynamic_sampling"])
async def test_batch_groups_are_mixed_and_complete(make_api, policy):
    api = await ready_api(make_api, policy=policy)
    r = await api.next_batch()
    assert r.status_code == 200, r.text
    batch = r.json()
    assert batch["redelivered"] is False and batch["policy_version"] == 0
    assert len(batch["groups"]) == 2
    for g in batch["groups"]:
        assert len(g["rollouts"]) == 8
        assert 0.0 in rewards(g) and 1.0 in rewards(g)
        assert g["prompt_id"] in {"m1", "m2"} and g["prompt"] == f"question {g['prompt_id']}"
        assert g["answer"] == "42" and g["task"] == "exact"
        assert sorted(slot_of(x["rollout_id"]) for x in g["rollouts"]) == list(range(8))
        assert all(x["rollout_id"].startswith(g["group_id"] + ":") for x in g["rollouts"])
        assert all(x["policy_version"] == 0 and x["completion_tokens"] == 5
                   for x in g["rollouts"])
    c = await api.counters()
    assert (c["groups_delivered"], c["rollouts_delivered"], c["batches_formed"]) == (2, 16, 1)
    assert batch["stats"]["rollouts_spent"] == c["rollouts_completed"]
    if policy == "dynamic_sampling":
        assert c["groups_abandoned"] == 0 and c["rollouts_not_spent_on_abandoned_groups"] == 0
        assert c["groups_dropped_saturated"] == batch["stats"]["groups_dropped"] > 0
    else:
        assert c["groups_abandoned"] == batch["stats"]["groups_abandoned"] > 0
    for g in batch["groups"]:
        assert (await api.group(g["group_id"]))["state"] == "delivered"


async def test_uniform_delivers_saturated_groups_too(make_api):
    api = await ready_api(make_api, policy="uniform",
                          prompts=[prompt_spec("f1", "fail"), prompt_spec("s1", "success")])
    batch = (await api.next_batch()).json()
    assert len(batch["groups"]) == 2
    for g in batch["groups"]:
        assert len(g["rollouts"]) == 8 and len(set(rewards(g))) == 1
    c = await api.counters()
    assert c["groups_abandoned"] == c["groups_dropped_saturated"] == 0


async def test_ack_then_ack_again_then_unknown(make_api):
    api = await ready_api(make_api)
    batch = (await api.next_batch()).json()
    bid = batch["batch_id"]
    assert await api.ok("POST", f"/batches/{bid}/ack") == \
        {"batch_id": bid, "acked": True, "already_acked": False}
    assert await api.ok("POST", f"/batches/{bid}/ack") == \
        {"batch_id": bid, "acked": True, "already_acked": True}
    c = await api.counters()
    assert (c["batches_acked"], c["groups_acked"]) == (1, 2)
    assert {(await api.group(g["group_id"]))["state"] for g in batch["groups"]} == {"acked"}
    r = await api.post("/batches/b-nope/ack")
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_batch"


async def test_unacked_batch_is_redelivered_once_per_timeout(make_api):
    api = await ready_api(make_api)
    batch = (await api.next_batch()).json()
    api.clock.advance(api.settings.batch_ack_timeout_s - 1)
    assert (await api.next_batch()).status_code == 204  # not yet due
    api.clock.advance(2)
    again = (await api.next_batch()).json()
    assert again["batch_id"] == batch["batch_id"] and again["redelivered"] is True
    assert again["groups"] == batch["groups"] and again["stats"] == batch["stats"]
    assert (await api.next_batch()).status_code == 204  # once, not on every call
    assert (await api.counters())["batches_redelivered"] == 1
    await api.ok("POST", f"/batches/{batch['batch_id']}/ack")
    api.clock.advance(api.settings.batch_ack_timeout_s + 1)
    assert (await api.next_batch()).status_code == 204
    assert (await api.counters())["batches_redelivered"] == 1


@pytest.mark.parametrize("published, delivered", [([1], True), ([1, 2], False), ([5], False)])
async def test_groups_staler_than_max_staleness_are_dropped(make_api, published, delivered):
    api = await ready_api(make_api, max_staleness=1)
    stats = await api.stats()
    assert stats["queues"]["ready_groups"] == 2
    for v in published:
        assert (await api.publish(v)).status_code == 200
    r = await api.next_batch()
    c = await api.counters()
    if delivered:
        assert r.status_code == 200 and r.json()["policy_version"] == published[-1]
        assert c["groups_dropped_stale"] == 0
    else:
        assert r.status_code == 204
        assert c["groups_dropped_stale"] == 2 and c["groups_delivered"] == 0
        assert (await api.stats())["queues"]["ready_groups"] == 0


async def test_stale_drop_is_reported_in_the_next_batch_stats(make_api):
    api = await ready_api(make_api, max_staleness=0)
    await api.publish(1)
    assert (await api.next_batch()).status_code == 204
    await api.work("w1", 8, policy_version=1)
    batch = (await api.next_batch()).json()
    assert len(batch["groups"]) == 2 and batch["stats"]["groups_dropped"] >= 2


@pytest.mark.parametrize("cap", [16, None])
async def test_rollout_cap_ends_a_batch_early(make_api, cap):
    api = await make_api(batch_size=4, prefetch_batches=1, max_rollouts_per_batch=cap)
    await api.add(prompt_spec("m1", "mixed"), prompt_spec("m2", "mixed"))
    for _ in range(2):  # 2 groups x (4 probes, then 4 after the commit)
        lease = await api.lease("w1", 8)
        assert len(lease["rollouts"]) == 8
        await api.report("w1", [result_for(r) for r in lease["rollouts"]])
    assert (await api.stats())["queues"]["ready_groups"] == 2
    r = await api.next_batch()
    if cap is None:
        assert r.status_code == 204  # 2 of 4 groups ready: wait for more
        return
    assert r.status_code == 200
    batch = r.json()
    assert len(batch["groups"]) == 2
    assert batch["stats"]["ended_early"] is True and batch["stats"]["rollouts_spent"] == 16


async def test_full_batch_is_not_marked_ended_early(make_api):
    api = await ready_api(make_api)
    assert (await api.next_batch()).json()["stats"]["ended_early"] is False


async def test_partial_commit_delivers_the_mixed_prefix(make_api):
    api = await ready_api(make_api, commit="partial")
    batch = (await api.next_batch()).json()
    assert len(batch["groups"]) == 2
    for g in batch["groups"]:
        assert len(g["rollouts"]) == 4  # the 4 probes: committed at the 2nd, no more issued
        assert 0.0 in rewards(g) and 1.0 in rewards(g)
    assert (await api.counters())["rollouts_delivered"] == \
        sum(len(g["rollouts"]) for g in batch["groups"])


async def test_size_override_and_token_payloads_pass_through(make_api):
    api = await make_api(**SMALL)
    await api.add(prompt_spec("m1", "mixed"))
    for _ in range(2):
        lease = await api.lease("w1", 4)
        await api.report("w1", [result_for(r, token_ids=[1, 2, slot_of(r["rollout_id"])],
                                           logprobs=[-0.5, -0.25]) for r in lease["rollouts"]])
    batch = (await api.next_batch(size=1)).json()
    (group,) = batch["groups"]
    for x in group["rollouts"]:
        assert x["token_ids"] == [1, 2, slot_of(x["rollout_id"])]
        assert x["logprobs"] == [-0.5, -0.25]
        assert x["completion"] == f"completion of {x['rollout_id']}"


async def test_sdk_next_batch_and_ack(make_api):
    api = await ready_api(make_api)
    async with sdk_for(api.app) as sara:
        batch = await sara.next_batch(wait_s=0)
        assert batch is not None and len(batch.groups) == 2
        assert all(len(g.rollouts) == 8 for g in batch.groups)
        assert (await sara.ack(batch.batch_id)).acked
        assert await sara.next_batch(wait_s=0) is None
