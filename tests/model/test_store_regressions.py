"""Deterministic reproductions of the bugs the stateful model test found: strict xfails while a
bug is open (each passes once it is fixed, and then the marker must go), plain tests after."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from sara_client.models import (AddPromptsRequest, LeaseRequest, PromptIn, ResultsRequest,
                                RolloutResult)
from sara_service.core.scheduler import Scheduler
from sara_service.settings import Settings
from sara_service.store.store import Store

pytestmark = pytest.mark.anyio


@pytest.fixture
async def sched(redis_url, fake_clock):
    """sara, k = 4, uniform prior: a group probes 2 rollouts and abandons after 2 pure outcomes."""
    client = aioredis.Redis.from_url(redis_url)
    settings = Settings(redis_url=redis_url, namespace="regress", policy="sara", group_size=4,
                        tau_low=0.5, prior="uniform", selection="epoch", batch_size=2,
                        prefetch_batches=2, lease_ttl_s=60.0)
    s = Scheduler(settings, Store(client, "regress"), fake_clock)
    await s.add_prompts(AddPromptsRequest(prompts=[PromptIn(id=f"p{i}", prompt=f"q{i}")
                                                   for i in range(8)]))
    try:
        yield s
    finally:
        await client.aclose()


def results(worker: str, *pairs: tuple[str, float]) -> ResultsRequest:
    return ResultsRequest(worker_id=worker, results=[
        RolloutResult(rollout_id=rid, reward=reward, completion="x") for rid, reward in pairs])


async def test_late_result_for_an_open_group_answers_continue(sched, fake_clock):
    first = await sched.lease(LeaseRequest(worker_id="w1", max_rollouts=2, wait_s=0))
    rid = first.rollouts[0].rollout_id
    fake_clock.advance(61)  # w1's lease runs out: its rollouts are issued again
    second = await sched.lease(LeaseRequest(worker_id="w2", max_rollouts=1, wait_s=0))
    assert [r.rollout_id for r in second.rollouts] == [rid]
    answered = await sched.report(results("w1", (rid, 1.0)))  # w1 answers first: accepted
    assert answered.accepted == 1
    assert [(d.group_id, d.decision) for d in answered.decisions] == [
        (first.rollouts[0].group_id, "continue")]
    late = await sched.report(results("w2", (rid, 0.0)))  # w2's cancelled copy: late
    assert late.late == 1
    assert [d.decision for d in late.decisions] == ["continue"]  # the group is still open


# found by the model test, fixed since (lease.lua counts a grant only for a new lease hash)
async def test_lease_call_counts_one_grant(sched):
    one = await sched.lease(LeaseRequest(worker_id="w1", max_rollouts=1, wait_s=0))
    assert len(one.rollouts) == 1  # its group issued 2: one is left pending
    two = await sched.lease(LeaseRequest(worker_id="w1", max_rollouts=2, wait_s=0))
    assert len(two.rollouts) == 2  # the pending one, then one of a newly opened group
    assert await sched.store.run.counter_values(("leases_granted",)) == {"leases_granted": 2}
