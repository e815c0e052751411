"""Flow control: groups open only while ready + expected yield of open groups < target."""

from __future__ import annotations

import pytest

from .conftest import count_scripts, prompt_spec, result_for

pytestmark = pytest.mark.anyio

P0 = 7 / 9  # p_eff of a fresh group: k=8, uniform prior


async def queues(api):
    stats = await api.stats()
    return stats["queues"], stats["counters"]


async def test_groups_stop_opening_at_the_target_and_resume_after_a_batch(make_api):
    api = await make_api(batch_size=2, prefetch_batches=1)  # target 2
    await api.add(*(prompt_spec(f"m{i}", "mixed") for i in range(6)))
    held = []
    for expected_open in (1, 2, 3):  # 0, 7/9, 14/9 < 2: each lease opens one more group
        lease = await api.lease("w1", 4)
        assert len(lease["rollouts"]) == 4
        held += lease["rollouts"]
        q, c = await queues(api)
        assert c["groups_opened"] == q["open_groups"] == expected_open
        assert q["expected_yield_open"] == pytest.approx(expected_open * P0)
    assert q["flow_target"] == 2 and q["expected_yield_open"] >= 2

    scripts = count_scripts(api.app)
    for _ in range(2):  # target met: nothing more to lease, nothing more opened
        empty = await api.lease("w2", 8)
        assert empty["rollouts"] == [] and empty["lease_id"] is None
    # the lease script says there is no room: no open_groups call is made only to be refused
    # (a worker held back costs one script call)
    assert scripts == {"lease": 2}
    q, c = await queues(api)
    assert c["groups_opened"] == 3 and q["pending"] == 0 and q["leased"] == 12

    await api.report("w1", [result_for(r) for r in held])  # all three commit
    q, c = await queues(api)
    assert q["expected_yield_open"] == pytest.approx(3.0) and c["groups_committed"] == 3
    rest = await api.lease("w1", 12)
    assert len(rest["rollouts"]) == 12 and (await api.counters())["groups_opened"] == 3
    await api.report("w1", [result_for(r) for r in rest["rollouts"]])
    q, c = await queues(api)
    assert (q["ready_groups"], q["open_groups"], q["expected_yield_open"]) == (3, 0, 0)
    assert (await api.lease("w1", 8))["rollouts"] == []  # 3 ready >= 2

    assert (await api.next_batch()).status_code == 200  # takes 2: 1 ready left
    lease = await api.lease("w1", 8)
    assert len(lease["rollouts"]) == 8
    q, c = await queues(api)
    assert c["groups_opened"] == 5 and q["open_groups"] == 2
    assert q["ready_groups"] + q["expected_yield_open"] == pytest.approx(1 + 2 * P0)


async def test_the_work_floor_fills_short_leases_until_a_batch_is_ready(make_api):
    """With a work floor of 2 (internal: benchmarks set it in process), short leases open groups
    up to twice the flow target while no batch is ready; once one is, only the target counts, as
    without a floor."""
    api = await make_api(batch_size=2, prefetch_batches=1, work_floor=2.0)  # target 2, floor 4
    await api.add(*(prompt_spec(f"m{i}", "mixed") for i in range(12)))
    held = []
    for expected_open in range(1, 7):  # 7/9 each: the sixth takes the open yield past 4
        lease = await api.lease("w1", 4)
        assert len(lease["rollouts"]) == 4
        held += lease["rollouts"]
        q, c = await queues(api)
        assert c["groups_opened"] == expected_open
    assert (await api.lease("w1", 4))["rollouts"] == []  # 42/9 >= 4
    await api.report("w1", [result_for(r) for r in held])  # all six commit: 6 expected
    rest = await api.lease("w1", 24)
    await api.report("w1", [result_for(r) for r in rest["rollouts"]])
    q, c = await queues(api)
    assert (q["ready_groups"], c["groups_opened"]) == (6, 6)
    assert (await api.next_batch()).status_code == 200  # 4 ready: a batch's worth
    assert (await api.lease("w1", 4))["rollouts"] == []  # 4 >= 2, and the floor is off
    assert (await api.next_batch()).status_code == 200
    assert (await api.next_batch()).status_code == 200  # none ready: the floor is back
    for _ in range(6):
        assert len((await api.lease("w1", 4))["rollouts"]) == 4
    assert (await api.lease("w1", 4))["rollouts"] == []
    assert (await api.counters())["groups_opened"] == 12


async def test_abandoned_groups_free_room_for_new_ones(make_api):
    api = await make_api(batch_size=1, prefetch_batches=1)  # target 1
    await api.add(prompt_spec("f1", "fail"), prompt_spec("f2", "fail"))
    first = await api.lease("w1", 4)
    second = await api.lease("w1", 4)
    assert len(second["rollouts"]) == 4  # 7/9 < 1: one more group fits
    assert (await api.lease("w1", 4))["rollouts"] == []  # 14/9 >= 1
    await api.report("w1", [result_for(r) for r in first["rollouts"]])  # abandoned
    q, c = await queues(api)
    assert c["groups_abandoned"] == 1 and q["expected_yield_open"] == pytest.approx(P0)
    assert len((await api.lease("w1", 4))["rollouts"]) == 4
    assert (await api.counters())["groups_opened"] == 3


async def test_lease_never_opens_more_than_the_target_in_one_call(make_api):
    api = await make_api(batch_size=2, prefetch_batches=1)
    await api.add(*(prompt_spec(f"m{i}", "mixed") for i in range(20)))
    lease = await api.lease("w1", 64)
    q, c = await queues(api)
    assert c["groups_opened"] <= 3 and len(lease["rollouts"]) == 4 * c["groups_opened"]
    assert q["expected_yield_open"] < 2 + P0


async def test_tiny_pool_opens_each_prompt_once_per_call(api):
    await api.add(prompt_spec("only", "mixed"))
    lease = await api.lease("w1", 64)
    assert len({r["group_id"] for r in lease["rollouts"]}) == 1
    assert (await api.counters())["groups_opened"] == 1


async def test_a_lease_that_opens_groups_is_one_script_call(make_api):
    """A uniform-prior run: the lease script opens groups on the epoch's next prompts itself
    (no separate epoch pop, open_groups or second lease); when the epoch runs dry the scheduler
    starts the next one and opens the rest."""
    api = await make_api(batch_size=64, prefetch_batches=4)
    await api.add(*(prompt_spec(f"f{i}", "fail") for i in range(4)))
    store = api.app.state.scheduler.store
    first = await api.lease("w1", 4)  # the first epoch starts
    assert len(first["rollouts"]) == 4
    scripts = count_scripts(api.app)
    lease = await api.lease("w1", 8)  # two more groups of the epoch's four
    assert len(lease["rollouts"]) == 8 and scripts == {"lease": 1}
    assert await store.redis.llen(store.keys.epoch_queue) == 1
    # all three abandoned: their prompts are free again
    await api.report("w1", [result_for(r) for r in first["rollouts"] + lease["rollouts"]])
    scripts.clear()
    # the epoch's last prompt, then the next epoch's three others (the fourth, just opened here,
    # is passed over: one group per prompt at a time)
    lease = await api.lease("w1", 16)
    assert len(lease["rollouts"]) == 16 and (await api.counters())["groups_opened"] == 7
    assert len({r["prompt_id"] for r in lease["rollouts"]}) == 4
    assert scripts == {"lease": 2, "refill_epoch": 1, "open_groups": 1}
    assert (await api.counters())["prompts_skipped_busy"] == 1
