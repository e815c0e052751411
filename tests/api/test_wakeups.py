"""Long polls wake on Redis notifications, across replicas, instead of re-running their scripts on
a timer.

Two apps (replicas A and B) share one Redis namespace. A poll waits on A; B's request makes work
or a batch available; A's poll answers. The fallback re-check is set far longer than the test
runs, and each test counts A's script calls while it waits: none, then one round per wake-up.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from .conftest import count_scripts, prompt_spec

pytestmark = pytest.mark.anyio

NO_FALLBACK = {"poll_interval_s": 600.0}  # a wait that ends did not end on the timer
SAFETY_S = 20.0  # bounds a broken test; never how the test synchronises


async def test_a_waiting_lease_wakes_when_another_replica_adds_work(make_api):
    a, b = await make_api(**NO_FALLBACK), await make_api(**NO_FALLBACK)
    calls = count_scripts(a.app)
    wake = a.app.state.scheduler.wakeups
    poll = asyncio.create_task(a.post("/leases", {"worker_id": "w1", "max_rollouts": 2,
                                                  "wait_s": 60}))
    await asyncio.wait_for(wake.until_waiting(1), SAFETY_S)
    while_waiting = dict(calls)
    assert while_waiting == {"lease": 1}  # one check, then it waits

    await b.add(prompt_spec("m1", "mixed"))  # replica B: new prompts, groups can open
    answer = await asyncio.wait_for(poll, SAFETY_S)

    assert answer.status_code == 200 and len(answer.json()["rollouts"]) == 2
    assert wake.stats.woken["lease"] == 1 and wake.stats.fallback["lease"] == 0
    # one more round after the wake-up: lease (empty), a new epoch, open groups, lease again
    assert calls - Counter(while_waiting) == Counter(
        {"lease": 2, "refill_epoch": 1, "open_groups": 1})


async def test_a_waiting_trainer_wakes_when_another_replica_makes_a_batch(make_api):
    small = {"batch_size": 2, "prefetch_batches": 1, **NO_FALLBACK}
    a, b = await make_api(**small), await make_api(**small)
    calls = count_scripts(a.app)
    wake = a.app.state.scheduler.wakeups
    poll = asyncio.create_task(a.post("/batches/next", {"wait_s": 60}))
    await asyncio.wait_for(wake.until_waiting(1), SAFETY_S)
    assert calls == {"form_batch": 1}

    await b.add(prompt_spec("m1", "mixed"), prompt_spec("m2", "mixed"))
    await b.work("w1", 8)  # replica B's results make two groups ready
    answer = await asyncio.wait_for(poll, SAFETY_S)

    assert answer.status_code == 200 and len(answer.json()["groups"]) == 2
    # it checked once up front and once more when two groups were ready (the wake-up says how
    # many): not for the first ready group alone, never on a timer
    assert wake.stats.fallback["batch"] == 0 and wake.stats.woken["batch"] == 1
    assert calls["form_batch"] == 2


async def test_results_that_only_continue_a_group_do_not_wake_the_trainer(make_api):
    a = await make_api(**NO_FALLBACK)
    wake = a.app.state.scheduler.wakeups
    await a.add(prompt_spec("m1", "mixed"))
    poll = asyncio.create_task(a.post("/batches/next", {"wait_s": 60}))
    await asyncio.wait_for(wake.until_waiting(1), SAFETY_S)
    lease = await a.lease("w1", 1)
    await a.report("w1", [{"rollout_id": lease["rollouts"][0]["rollout_id"], "reward": 0.0}])
    assert wake.stats.woken["batch"] == 0 and wake.waiting == 1  # still waiting, undisturbed
    a.app.state.scheduler.begin_shutdown()
    answer = await asyncio.wait_for(poll, SAFETY_S)
    assert answer.status_code == 204


async def test_shutdown_answers_waiting_polls_at_once(make_api):
    a = await make_api(**NO_FALLBACK)
    scheduler = a.app.state.scheduler
    lease = asyncio.create_task(a.post("/leases", {"worker_id": "w1", "wait_s": 60}))
    batch = asyncio.create_task(a.post("/batches/next", {"wait_s": 60}))
    await asyncio.wait_for(scheduler.wakeups.until_waiting(2), SAFETY_S)
    scheduler.begin_shutdown()
    leased, batched = await asyncio.wait_for(asyncio.gather(lease, batch), SAFETY_S)
    assert leased.status_code == 200 and leased.json()["rollouts"] == []
    assert batched.status_code == 204
    assert scheduler.wakeups.stats.stopped == 2


async def test_a_wait_with_no_notification_ends_on_the_fallback_timer(make_api):
    a = await make_api(poll_interval_s=0.01)
    wake = a.app.state.scheduler.wakeups
    ticket = await wake.ticket("lease")
    assert await wake.wait(ticket, "lease", 0.01) == "fallback"
    assert wake.stats.fallback["lease"] == 1 and wake.stats.woken["lease"] == 0


async def test_a_batch_ticket_fires_only_when_enough_groups_are_ready(make_api):
    a = await make_api(**NO_FALLBACK)
    wake = a.app.state.scheduler.wakeups
    four, one = await wake.ticket("batch", need=4), await wake.ticket("batch", need=1)
    wake.fire("batch", 3)  # three ready: enough for one, not for four
    assert one.event.is_set() and not four.event.is_set()
    wake.fire("batch", -1)  # any size may go (a drain): every batch poll checks
    assert four.event.is_set()


async def test_a_poll_that_finds_work_at_once_leaves_no_ticket_behind(make_api):
    a = await make_api(**NO_FALLBACK)
    await a.add(prompt_spec("m1", "mixed"))
    answer = await a.post("/leases", {"worker_id": "w1", "max_rollouts": 1, "wait_s": 60})
    assert len(answer.json()["rollouts"]) == 1
    assert a.app.state.scheduler.wakeups.tickets == 0
