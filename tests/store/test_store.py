"""Each Lua transition against a real Redis, through the Store API."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from sara_client.models import PromptIn, RolloutResult
from sara_service.math.allocation import decay_posterior, plan_group
from sara_service.errors import Conflict, NotFound, UnknownRollouts
from sara_service.store.store import Store
from sara_service.store.codec import StoredPosterior
from tests.store._apply import apply_results

pytestmark = pytest.mark.anyio

SARA8 = plan_group("sara", 8, 1.0, 1.0, 0.5)  # abandon after 4 pure outcomes, probe 4
DS8 = plan_group("dynamic_sampling", 8, 1.0, 1.0, 0.5)
UNI8 = plan_group("uniform", 8, 1.0, 1.0, 0.5)


async def report(store, worker, pairs, now=1.0):
    """Apply [(rollout_id, success)] as one results call."""
    results = [RolloutResult(rollout_id=rid, reward=float(ok), completion_tokens=3)
               for rid, ok in pairs]
    return await apply_results(store, now, worker, results, [ok for _, ok in pairs], 0.5, 1.0, 1.0,
                                     100.0)


async def lease(store, worker, n, now=0.0, lease_id="L1", ttl=10.0):
    rollouts, cancel = await store.leases.lease(now, worker, lease_id, n, now + ttl, 100, "sim")
    return [r.rollout_id for r in rollouts], cancel


async def counters(store):
    return {name: float(v) for name, v in (await store.run.counters()).items()}



async def many_prompts(store: Store, n: int = 32) -> None:
    """Register "p0" ... "p{n-1}": a prompt has one group in flight at a time, so a test that
    holds several groups open at once needs as many prompts."""
    await store.prompts.add_prompts([(f"p{i}", PromptIn(prompt=f"q{i}")) for i in range(n)],
                                    1.0, 1.0, 0)

async def test_add_prompts_is_idempotent_on_id(store):
    prompts = [("a", PromptIn(prompt="1+1", answer="2")), ("b", PromptIn(prompt="2+2"))]
    assert await store.prompts.add_prompts(prompts, 1.0, 1.0, 0) == (2, [])
    assert await store.prompts.add_prompts([("a", PromptIn(prompt="changed"))], 1.0, 1.0, 0) == (0, ["a"])
    content, post = await store.prompts.get_prompt("a")
    assert content["prompt"] == "1+1" and post == StoredPosterior(alpha=1.0, beta=1.0, version=0)
    with pytest.raises(NotFound):
        await store.prompts.get_prompt("nope")


async def test_epoch_visits_every_prompt_once_then_refills_once(store):
    await store.prompts.add_prompts([(f"p{i}", PromptIn(prompt=str(i))) for i in range(5)], 1, 1, 0)
    rev = lambda ids, seed: list(reversed(ids))  # noqa: E731 - a deterministic "shuffle"
    first = await store.prompts.pop_epoch(3, 0, rev) + await store.prompts.pop_epoch(3, 0, rev)
    assert sorted(first) == ["p"] + [f"p{i}" for i in range(5)]  # "p" is the fixture's
    assert int(await store.redis.get(store.keys.epoch)) == 1
    await store.prompts.pop_epoch(1, 0, rev)
    assert int(await store.redis.get(store.keys.epoch)) == 2


async def test_leases_that_find_the_epoch_dry_together_refill_it_once(store):
    """Every lease in flight finds the queue short at the same moment: one of them reads and
    shuffles the pool, the others wait for it and pop from the new epoch."""
    await store.prompts.add_prompts([(f"p{i}", PromptIn(prompt=str(i))) for i in range(19)], 1, 1, 0)
    shuffles = []

    def counting(ids, seed):
        shuffles.append(seed)
        return list(reversed(ids))

    popped = await asyncio.gather(*(store.prompts.pop_epoch(5, 0, counting) for _ in range(4)))
    assert len(shuffles) == 1
    flat = [pid for part in popped for pid in part]
    assert [len(part) for part in popped] == [5] * 4 and len(set(flat)) == 20  # 19 + fixture's


async def test_refill_by_two_replicas_that_saw_the_same_epoch_happens_once(store):
    k = store.keys
    for order in (["x", "y"], ["y", "x"]):
        args = dict(seen_epoch=0, prompt_ids=" ".join(order))
        assert int(await store.runner.run("refill_epoch", args)) == 1
    assert await store.redis.lrange(k.epoch_queue, 0, -1) == [b"x", b"y"]


async def test_flow_control_stops_opening_at_the_expected_yield_target(store):
    await many_prompts(store)
    groups = [(f"g{i}", f"p{i}", SARA8) for i in range(10)]
    # each new sara group is worth p_eff(0) = 7/9 expected effective groups
    opened = await store.groups.open_groups(0.0, 2, groups, "complete")
    assert opened == 3  # 0 -> 7/9 -> 14/9 -> 21/9 >= 2
    assert (await counters(store))["rollouts_issued"] == 3 * SARA8.initial_issue


async def test_the_work_floor_opens_past_the_target_only_while_less_than_a_batch_is_ready(store):
    """A short lease may open up to the floor's target while fewer than floor_ready groups are
    ready (the trainer is waiting: an idle engine is the cost); once a batch is ready, the
    flow target holds again."""
    await many_prompts(store)
    floor = dict(floor_target=4.0, floor_ready=2)
    groups = [(f"g{i}", f"p{i}", SARA8) for i in range(10)]
    opened = await store.groups.open_groups(0.0, 2, groups, "complete", **floor)
    assert opened == 6  # 7/9 each: 5 of them are 35/9 < 4, the sixth reaches 42/9
    # two groups ready (a batch's worth of floor_ready): the floor no longer applies
    await store.redis.rpush(store.keys.ready, "r1", "r2")
    more = [(f"h{i}", f"p{10 + i}", SARA8) for i in range(3)]
    assert await store.groups.open_groups(0.0, 2, more, "complete", **floor) == 0
    # a floor at or under the target is no floor
    await store.redis.delete(store.keys.ready)
    assert await store.groups.open_groups(0.0, 8, more, "complete", floor_target=4.0,
                                          floor_ready=2) == 3


async def test_a_lease_reports_room_under_the_work_floor(store):
    """`room` (open_groups could open now) follows the same floor as the opening itself."""
    await many_prompts(store)
    await store.groups.open_groups(0.0, 100, [(f"g{i}", f"p{i}", SARA8) for i in range(3)],
                                   "complete")  # 21/9 expected
    grant = await store.leases.lease_with_policy(0.0, "w", "L", 1, 10.0, 100, None,
                                                 flow_target=2)
    assert not grant.room
    grant = await store.leases.lease_with_policy(0.0, "w", "L", 1, 10.0, 100, None,
                                                 flow_target=2, floor_target=4.0, floor_ready=1)
    assert grant.room
    await store.redis.rpush(store.keys.ready, "r1")
    grant = await store.leases.lease_with_policy(0.0, "w", "L", 1, 10.0, 100, None,
                                                 flow_target=2, floor_target=4.0, floor_ready=1)
    assert not grant.room  # 1 ready + 21/9 >= 2, and a batch is ready: no floor


async def test_lease_says_whether_flow_control_has_room_to_open_groups(store):
    await many_prompts(store)
    async def room(target):
        return (await store.leases.lease_with_policy(0.0, "w", "L", 1, 10.0, 100, None,
                                              flow_target=target)).room

    assert await room(2) is True
    assert await store.groups.open_groups(0.0, 2, [(f"g{i}", f"p{i}", SARA8) for i in range(3)],
                                   "complete") == 3  # 21/9 of yield: at the target
    assert await room(2) is False and await room(3) is True
    assert await room(0) is False  # not asked
    await store.run.set_run_state("pause")
    assert await room(3) is False  # open_groups would open nothing while paused


async def test_the_migration_writes_the_yield_total_a_run_without_one_lacks(store):
    await many_prompts(store)
    # a namespace from before the total existed has only the open-groups zset
    assert await store.groups.open_groups(0.0, 2, [(f"g{i}", f"p{i}", SARA8) for i in range(3)],
                                   "complete") == 3
    total = int(await store.redis.get(store.keys.open_yield))
    assert total == 3 * round(SARA8.p_eff_fail[0] * 1e9)
    await store.redis.delete(store.keys.open_yield)
    assert await store.run.ensure_format() == "migrated"
    assert int(await store.redis.get(store.keys.open_yield)) == total
    grant = await store.leases.lease_with_policy(0.0, "w", "L", 1, 10.0, 100, None, flow_target=2)
    assert grant.room is False   # flow control sees the target met


async def test_the_migration_joins_p_eff_tables_kept_as_a_field_per_entry(store):
    # before the p_eff tables became one JSON list per side, a group stored pf:<n> and ps:<n>
    plan = dataclasses.replace(SARA8, initial_issue=8)
    for gid in ("new", "old"):
        await store.prompts.add_prompts([(f"p_{gid}", PromptIn(prompt=gid))], 1.0, 1.0, 0)
        await store.groups.open_groups(0.0, 100, [(gid, f"p_{gid}", plan)], "complete")
    old = store.keys.group("old")
    fail, succ = (json.loads(x) for x in await store.redis.hmget(old, "pf", "ps"))
    await store.redis.hdel(old, "pf", "ps")
    await store.redis.hset(old, mapping={**{f"pf:{n}": repr(x) for n, x in enumerate(fail)},
                                         **{f"ps:{n}": repr(x) for n, x in enumerate(succ)}})
    assert await store.run.ensure_format() == "migrated"
    assert [json.loads(x) for x in await store.redis.hmget(old, "pf", "ps")] == [fail, succ]
    assert not [f for f in await store.redis.hkeys(old) if b":" in f and f[:2] in (b"pf", b"ps")]
    for gid in ("new", "old"):
        applied = await report(store, "w", [(f"{gid}:{i}", 0) for i in range(4)])
        assert applied.decisions == [(gid, "abandon")]
    p_new, p_old = (float(x) for x in await store.redis.hmget(
        store.keys.group("new"), "p_eff") + await store.redis.hmget(old, "p_eff"))
    assert p_new == p_old == pytest.approx(fail[4])


async def test_lease_skips_cancelled_rollouts_and_hands_out_cancel_lists(store):
    await store.groups.open_groups(0.0, 100, [("g", "p", SARA8)], "complete")
    ids, _ = await lease(store, "w1", 2, lease_id="L1")
    assert ids == ["g:0", "g:1"]
    # two failures, then the worker w2 holds g:2 when the fourth failure abandons the group
    ids2, _ = await lease(store, "w2", 1, lease_id="L2")
    await report(store, "w1", [("g:0", 0), ("g:1", 0)])
    applied = await report(store, "w3", [("g:3", 0), ("g:2", 0)])
    assert applied.decisions == [("g", "abandon")]
    assert ids2 == ["g:2"]
    # g:2 was answered by w3 first: w2's copy is pointless and w2 is told so
    _, cancel = await lease(store, "w2", 5, lease_id="L3")
    assert cancel == ["g:2"]
    assert await lease(store, "w2", 5, lease_id="L4") == ([], [])  # drained once


async def test_a_lease_carries_each_prompts_content_once(store):
    """Eight rollouts of two groups of one prompt and one of another: the script's answer holds
    two contents, not nine; every rollout still gets its prompt."""
    await store.prompts.add_prompts([("q", PromptIn(prompt="other question", answer="7"))], 1.0, 1.0, 0)
    await store.groups.open_groups(0.0, 100, [("g1", "p", UNI8), ("g2", "q", UNI8)], "complete")
    keys = dict(lease=store.keys.lease("L1"), lease_rollouts=store.keys.lease_rollouts("L1"))
    args = dict(now=0.0, worker_id="w", lease_id="L1", max_rollouts=10, expires_at=10.0,
                key_ttl_s=100, backend="", requeue_limit=0, flow_target=0, plan="",
                audit_fraction=0, seed=0, group_ids="", floor_target=0, floor_ready=0,
                engine_occupancy="", engine_slots="")
    flat, prompts, *_ = await store.runner.run("lease", args, keys)
    assert len(flat) == 2 * 10 and [x.decode() for x in prompts[::2]] == ["p", "q"]
    grant = await store.leases.lease_with_policy(0.0, "w", "L2", 6, 10.0, 100, None)
    assert [(r.prompt_id, r.prompt["prompt"]) for r in grant.rollouts] == [
        ("q", "other question")] * 6


async def test_abandon_cancels_outstanding_rollouts_and_late_results_only_move_the_posterior(
        store):
    # SARA's own plans never have a rollout outstanding at abandonment (they issue exactly up to
    # the threshold); a plan that probes all k at once exercises the cancellation path.
    eager = dataclasses.replace(SARA8, initial_issue=8)
    await store.groups.open_groups(0.0, 100, [("g", "p", eager)], "complete")
    held, _ = await lease(store, "w1", 2, lease_id="L1")  # g:0, g:1 leased to w1
    applied = await report(store, "w2", [("g:2", 0), ("g:3", 0), ("g:4", 0), ("g:5", 0)])
    assert applied.decisions == [("g", "abandon")]
    c = await counters(store)
    assert c["rollouts_cancelled"] == 4  # g:0, g:1 (leased) and g:6, g:7 (pending)
    assert c["rollouts_not_spent_on_abandoned_groups"] == 0  # all k were issued
    assert [s.kind for s in await store.leases.slot_states(["g:0", "g:6"])] == ["cancelled"] * 2
    # the pending ones are never leased, and w1 learns to abort its two
    ids, cancel = await lease(store, "w1", 8, lease_id="L2")
    assert ids == [] and sorted(cancel) == held
    _, post_before = await store.prompts.get_prompt("p")
    late = await report(store, "w1", [("g:0", 1)])
    assert (late.accepted, late.late, late.decisions) == (0, 1, [("g", "abandon")])
    _, post_after = await store.prompts.get_prompt("p")
    assert post_after.alpha == post_before.alpha + 1
    after = await counters(store)
    for name in ("rollouts_completed", "rollouts_cancelled", "groups_abandoned"):
        assert after[name] == c[name]


async def test_unknown_rollout_applies_nothing(store):
    await store.groups.open_groups(0.0, 100, [("g", "p", SARA8)], "complete")
    before = await counters(store)
    with pytest.raises(UnknownRollouts) as info:
        await report(store, "w", [("g:0", 1), ("zz:0", 1), ("g:7", 0), ("bad", 1)])
    assert set(info.value.detail["unknown_rollout_ids"]) <= {"zz:0", "g:7", "bad"}
    assert await counters(store) == before


async def test_expired_lease_is_issued_again_and_first_result_wins(store):
    await store.groups.open_groups(0.0, 100, [("g", "p", SARA8)], "complete")
    ids, _ = await lease(store, "w1", 4, now=0.0, ttl=10.0)
    assert await store.leases.expire_leases(5.0) == 0
    assert await store.leases.expire_leases(10.5) == 4
    again, _ = await lease(store, "w2", 4, now=11.0, lease_id="L2")
    assert again == ids
    first = await report(store, "w1", [("g:0", 1)], now=12.0)  # the original holder answers first
    assert first.accepted == 1
    second = await report(store, "w2", [("g:0", 0)], now=12.5)
    # w2's copy was pointless once w1 answered: it is told to cancel, and the answer it sends
    # anyway is a fresh sample of the prompt (late: posterior only), not a second fill
    assert (second.accepted, second.duplicates, second.late) == (0, 0, 1)
    assert second.cancel == ["g:0"]
    again = await report(store, "w2", [("g:0", 0)], now=12.6)
    assert (again.duplicates, again.late) == (1, 0)
    (row,) = await store.groups.read_groups(["g"])
    assert (row["done"], row["s"]) == ("1", "1")  # counted once, with the first answer


async def test_heartbeat_extends_every_rollout_of_the_lease(store):
    await store.groups.open_groups(0.0, 100, [("g", "p", SARA8)], "complete")
    await lease(store, "w1", 4, now=0.0, ttl=10.0)
    assert await store.leases.heartbeat(8.0, "w1", "L1", 18.0, 100) == []
    assert await store.leases.expire_leases(15.0) == 0
    assert await store.leases.expire_leases(18.5) == 4
    with pytest.raises(NotFound):
        await store.leases.heartbeat(19.0, "w1", "nope", 29.0, 100)
    with pytest.raises(Conflict):
        await store.leases.heartbeat(19.0, "w2", "L1", 29.0, 100)


async def _ready_group(store, gid, plan=DS8, outcomes=(1, 0, 1, 1, 0, 1, 0, 1), version=0,
                       prompt="p"):
    if prompt != "p":
        await store.prompts.add_prompts([(prompt, PromptIn(prompt=f"q {prompt}"))], 1.0, 1.0, 0)
    await store.groups.open_groups(0.0, 100, [(gid, prompt, plan)], "complete")
    results = [RolloutResult(rollout_id=f"{gid}:{i}", reward=float(o), policy_version=version)
               for i, o in enumerate(outcomes)]
    return await apply_results(store, 1.0, "w", results, list(outcomes), 0.5, 1.0, 1.0, 100.0)


async def end_groups(store: Store, *gids: str) -> None:
    """Mark groups delivered and acked, so their prompt may open another: a prompt has one group
    in flight at a time, and the tests that follow one prompt over several groups are about its
    posterior, not about delivery."""
    await store.redis.hset(store.keys.group_states, mapping={gid: "acked" for gid in gids})


async def test_batch_forms_only_when_full_and_is_redelivered_until_acked(store):
    await _ready_group(store, "a", prompt="pa")
    assert await store.batches.form_batch(2.0, 2, 10.0, 1, None, "b1", 100.0) == ("none", None)
    await _ready_group(store, "b", prompt="pb")
    assert await store.batches.form_batch(2.0, 2, 10.0, 1, None, "b1", 100.0) == ("new", "b1")
    assert (await store.batches.read_batch("b1"))["groups"] == "a,b"
    assert await store.batches.form_batch(5.0, 2, 15.0, 1, None, "b2", 100.0) == ("none", None)
    assert await store.batches.form_batch(11.0, 2, 20.0, 1, None, "b3", 100.0) == ("redeliver", "b1")
    assert await store.batches.ack(12.0, "b1", 100.0) is False
    assert await store.batches.ack(12.0, "b1", 100.0) is True
    assert await store.batches.form_batch(30.0, 2, 40.0, 1, None, "b4", 100.0) == ("none", None)
    with pytest.raises(NotFound):
        await store.batches.ack(12.0, "nope", 100.0)
    c = await counters(store)
    assert (c["batches_formed"], c["batches_redelivered"], c["batches_acked"]) == (1, 1, 1)
    assert c["groups_delivered"] == 2 and c["rollouts_delivered"] == 16


async def test_stale_groups_are_dropped_at_delivery(store):
    await _ready_group(store, "old", version=0, prompt="p_old")
    await _ready_group(store, "new", version=2, prompt="p_new")
    await store.policy.publish_policy(1.0, 2, "ckpt-2")
    assert await store.batches.form_batch(2.0, 1, 10.0, 1, None, "b1", 100.0) == ("new", "b1")
    assert (await store.batches.read_batch("b1"))["groups"] == "new"
    assert (await counters(store))["groups_dropped_stale"] == 1
    assert await store.groups.group_state(["old"]) == ["dropped"]


async def test_rollout_cap_ends_a_batch_early(store):
    await _ready_group(store, "a")
    # 8 rollouts completed since the last batch; a cap of 8 closes the batch with what it has
    assert await store.batches.form_batch(2.0, 4, 10.0, 1, 9, "b0", 100.0) == ("none", None)
    assert await store.batches.form_batch(2.0, 4, 10.0, 1, 8, "b1", 100.0) == ("new", "b1")
    batch = await store.batches.read_batch("b1")
    assert '"ended_early":true' in batch["stats"] and '"rollouts_spent":8' in batch["stats"]


async def test_dynamic_sampling_drops_saturated_and_uniform_delivers_them(store):
    await _ready_group(store, "ds", plan=DS8, outcomes=(1,) * 8)
    await _ready_group(store, "uni", plan=UNI8, outcomes=(1,) * 8)
    assert await store.groups.group_state(["ds", "uni"]) == ["dropped", "ready"]


async def test_partial_commit_delivers_the_mixed_prefix(store):
    await store.groups.open_groups(0.0, 100, [("g", "p", SARA8)], "partial")
    out = await report(store, "w", [("g:0", 1), ("g:1", 0)])
    assert out.decisions == [("g", "commit")]
    (row,) = await store.groups.read_groups(["g"])
    assert int(row["issued"]) == 4  # nothing more is issued
    await report(store, "w", [("g:2", 1), ("g:3", 1)])
    assert await store.groups.group_state(["g"]) == ["ready"]


async def test_policy_versions_only_move_forward(store):
    assert (await store.policy.get_policy()).version == 0
    assert (await store.policy.publish_policy(1.0, 3, "c3")).version == 3
    with pytest.raises(Conflict):
        await store.policy.publish_policy(1.0, 3, "again")
    assert (await store.policy.get_policy()).checkpoint == "c3"


async def test_posterior_decays_toward_the_prior_as_the_policy_moves(store):
    await store.prompts.add_prompts([("p", PromptIn(prompt="q"))], 1.0, 1.0, 0)
    await _ready_group(store, "a", outcomes=(1, 1, 1, 1, 1, 1, 1, 0))
    _, post = await store.prompts.get_prompt("p")
    assert (post.alpha, post.beta) == (8.0, 2.0)
    await store.policy.publish_policy(1.0, 2, None)
    await end_groups(store, "a")
    await _ready_group(store, "b", outcomes=(0, 1, 1, 1, 1, 1, 1, 1))
    _, post = await store.prompts.get_prompt("p")
    # decayed by 0.5^2 first: a = 1 + 7/4, b = 1 + 1/4; then 7 successes and 1 failure
    assert post.alpha == pytest.approx(1 + 7 / 4 + 7) and post.beta == pytest.approx(1 + 1 / 4 + 1)
    assert post.version == 2 and post.groups == 2


async def _group_at_half_life(store, gid, outcomes, half_life, skipped=0):
    await store.groups.open_groups(0.0, 100, [(gid, "p", DS8)], "complete", skipped)
    results = [RolloutResult(rollout_id=f"{gid}:{i}", reward=float(o))
               for i, o in enumerate(outcomes)]
    await apply_results(store, 1.0, "w", results, list(outcomes), 1.0, 1.0, 1.0, 100.0, half_life)
    return (await store.prompts.get_prompt("p"))[1]


async def test_posterior_halves_per_half_life_in_epochs_of_the_pool_not_per_version(store):
    # the pool is the one prompt "p": each group opened (or prompt skipped) is one epoch
    post = await _group_at_half_life(store, "a", (1, 1, 1, 1, 1, 0, 0, 0), half_life=1.0)
    assert (post.alpha, post.beta, post.clock) == (6.0, 4.0, 1.0)
    await store.policy.publish_policy(1.0, 50, None)  # versions alone no longer forget (decay 1.0)
    await end_groups(store, "a")
    post = await _group_at_half_life(store, "b", (1, 1, 1, 1, 1, 0, 0, 0), half_life=1.0)
    assert (post.alpha, post.beta, post.clock) == (1 + 5 / 2 + 5, 1 + 3 / 2 + 3, 2.0)
    assert await store.prompts.pool_clock() == 2.0


async def test_lua_and_python_decay_posteriors_agree_on_the_pool_clock(store):
    post = await _group_at_half_life(store, "a", (1, 0, 1, 1, 0, 1, 0, 1), half_life=3.0)
    # three prompts skipped and one group opened: 4 epochs later, weight 0.5 ** (4 / 3)
    await end_groups(store, "a")
    post2 = await _group_at_half_life(store, "b", (0,) * 8, half_life=3.0, skipped=3)
    a, b = decay_posterior(post.alpha, post.beta, 1.0, 1.0, 1.0, 0, 3.0,
                           await store.prompts.pool_clock() - post.clock)
    assert post2.alpha == pytest.approx(a, rel=1e-13) and post2.beta == pytest.approx(b + 8,
                                                                                   rel=1e-13)
    assert post2.clock == 5.0


async def test_garbage_collection_removes_finished_groups(store):
    await _ready_group(store, "a", prompt="pa")
    await _ready_group(store, "b", prompt="pb")
    await store.batches.form_batch(2.0, 2, 10.0, 1, None, "b1", 100.0)
    await store.batches.ack(3.0, "b1", 50.0)
    assert await store.groups.collect_garbage(52.0) == 0
    assert await store.groups.collect_garbage(53.5) == 2
    assert await store.groups.read_groups(["a"]) == [{}]
    assert [s.kind for s in await store.leases.slot_states(["a:0", "b:7"])] == ["unissued"] * 2
    assert await store.groups.group_state(["a"]) == [None]


async def test_finished_groups_leave_their_outcome_class_in_the_prompt_history(store):
    await _ready_group(store, "m", outcomes=(1, 0, 1, 0, 1, 0, 1, 0))
    await store.policy.publish_policy(1.0, 1, None)
    await end_groups(store, "m")
    await _ready_group(store, "f", plan=UNI8, outcomes=(0,) * 8)
    await end_groups(store, "f")
    await store.groups.open_groups(0.0, 100, [("s", "p", SARA8)], "complete")
    await report(store, "w", [(f"s:{i}", 1) for i in range(4)])
    _, post = await store.prompts.get_prompt("p")
    # the saturated group is a full observation; the abandoned one (4 successes of 8) is
    # censored and carries its chance of having ended mixed under the posterior: m's evidence
    # halved by one version (a = 3, b = 3), then 8 failures and 4 successes give Beta(7, 11),
    # and q = 1 - E[gamma^4] = 1 - (7*8*9*10) / (18*19*20*21)
    q = round(1 - 7 * 8 * 9 * 10 / (18 * 19 * 20 * 21), 6)
    assert post.observations == [[0, "M"], [1, "F"], [1, "S", q]]
    assert (post.committed, post.saturated, post.abandoned) == (1, 1, 1)


async def test_an_aborted_rollout_teaches_nothing_and_its_holder_releases_it_at_once(store):
    await store.groups.open_groups(0.0, 100, [("g", "p", SARA8)], "complete")
    held, _ = await lease(store, "w1", 2, lease_id="L1")
    _, post_before = await store.prompts.get_prompt("p")
    aborted = [RolloutResult(rollout_id="g:0", reward=0.0, finish_reason="abort",
                             completion_tokens=5)]
    out = await apply_results(store, 1.0, "w1", aborted, [-1], 0.5, 1.0, 1.0, 100.0)
    assert (out.accepted, out.released, out.late) == (0, 1, 0)
    again, _ = await lease(store, "w2", 1, lease_id="L2")
    assert again == ["g:0"]  # back at the front of the queue, no lease expiry needed
    # an abort from a worker that no longer holds the slot changes nothing but token counts
    out = await apply_results(store, 1.0, "w1", aborted, [-1], 0.5, 1.0, 1.0, 100.0)
    assert (out.accepted, out.released, out.late) == (0, 0, 1)
    _, post_after = await store.prompts.get_prompt("p")
    assert (post_after.alpha, post_after.beta) == (post_before.alpha, post_before.beta)
    c = await counters(store)
    assert c["rollouts_completed"] == 0 and c["tokens_generated"] == 10


async def test_a_worker_error_teaches_nothing_until_the_slot_has_failed_three_times(store):
    await store.groups.open_groups(0.0, 100, [("g", "p", SARA8)], "complete")
    _, before = await store.prompts.get_prompt("p")
    broken = [RolloutResult(rollout_id="g:0", reward=0.0, finish_reason="error")]
    for attempt, worker in enumerate(("w1", "w2"), 1):
        held, _ = await lease(store, worker, 1, lease_id=f"L{attempt}")
        assert held == ["g:0"]  # released at once, so the next lease gets it again
        out = await apply_results(store, 1.0, worker, broken, [-2], 0.5, 1.0, 1.0, 100.0)
        assert (out.accepted, out.released) == (0, 1)
    _, during = await store.prompts.get_prompt("p")
    assert (during.alpha, during.beta) == (before.alpha, before.beta)
    # an error from a worker that no longer holds the slot neither releases nor counts
    out = await apply_results(store, 1.0, "w1", broken, [-2], 0.5, 1.0, 1.0, 100.0)
    assert (out.accepted, out.released, out.late) == (0, 0, 1)
    held, _ = await lease(store, "w3", 1, lease_id="L3")
    out = await apply_results(store, 1.0, "w3", broken, [-2], 0.5, 1.0, 1.0, 100.0)
    assert (out.accepted, out.released) == (1, 0)  # the third error: the slot is a failure
    _, after = await store.prompts.get_prompt("p")
    assert (after.alpha, after.beta) == (before.alpha, before.beta + 1)
    c = await counters(store)
    assert c["rollouts_errored"] == 4 and c["rollouts_completed"] == 1


async def test_upkeep_collects_every_overdue_group_not_one_batch_per_tick(store):
    from sara_service.core.scheduler import Scheduler
    from sara_service.settings import Settings

    await store.redis.zadd(store.keys.gc, {f"old{i}": 1.0 for i in range(25)})
    scheduler = Scheduler(Settings(redis_url="redis://unused", namespace="test"), store,
                          clock=lambda: 10.0)
    assert await scheduler.maintain(gc_batch=10) == (0, 25)
    assert await store.redis.zcard(store.keys.gc) == 0


async def test_flow_control_counts_every_uniform_group_as_one_delivery(store):
    await many_prompts(store)
    # uniform delivers saturated groups too: weighting them by p_eff over-opened groups that
    # then went stale waiting for a batch
    opened = await store.groups.open_groups(0.0, 2, [(f"u{i}", f"p{i}", UNI8) for i in range(5)], "complete")
    assert opened == 2
    await report(store, "w", [(f"u0:{i}", 1) for i in range(3)])
    assert await store.redis.zscore(store.keys.open_groups, "u0") == 1.0


async def test_workers_unseen_for_the_retention_time_are_forgotten(store):
    from sara_service.core.scheduler import Scheduler
    from sara_service.settings import Settings

    await store.groups.open_groups(0.0, 100, [("g", "p", SARA8)], "complete")
    await lease(store, "old", 1, now=0.0, lease_id="L1")
    await lease(store, "new", 1, now=100.0, lease_id="L2")
    await store.redis.hset(store.keys.cancels, mapping={"old": "g:0", "new": "g:1"})
    scheduler = Scheduler(Settings(redis_url="redis://unused", namespace="test",
                                   retention_s=50.0), store, clock=lambda: 120.0)
    await scheduler.maintain()
    assert [w.decode() for w in await store.redis.zrange(store.keys.workers, 0, -1)] == ["new"]
    fields = {f.decode() for f in await store.redis.hkeys(store.keys.worker_info)}
    assert fields and all(f.startswith("new|") for f in fields)
    assert await store.redis.hkeys(store.keys.cancels) == [b"new"]
    assert await store.run.prune_workers(1000.0) == 1   # and "new" once it is old enough


async def test_tokens_by_outcome_are_counted_once_per_slot_that_taught_the_posterior(store):
    # what tau_low=auto reads under SARA_AUTO_PRICE=tokens: the mean length of a success and of
    # a failure, from the same once-per-slot sample the posterior learns from
    await store.groups.open_groups(0.0, 100, [("g", "p", SARA8)], "complete")
    await lease(store, "w1", 4)
    lengths = {"g:0": (1, 10), "g:1": (0, 30), "g:2": (1, 12), "g:3": (0, 34)}
    results = [RolloutResult(rollout_id=rid, reward=float(ok), completion_tokens=n)
               for rid, (ok, n) in lengths.items()]
    outcomes = [ok for ok, _ in lengths.values()]
    await apply_results(store, 1.0, "w1", results, outcomes, 0.5, 1.0, 1.0, 100.0)
    # a duplicate answer for a slot already learned from is not a second sample
    await apply_results(store, 2.0, "w1", results[:1], outcomes[:1], 0.5, 1.0, 1.0, 100.0)
    c = await counters(store)
    assert (c["learned_success_rollouts"], c["learned_success_tokens"]) == (2, 22)
    assert (c["learned_failure_rollouts"], c["learned_failure_tokens"]) == (2, 64)
    assert c["tokens_generated"] == 96


async def test_a_batch_says_how_many_versions_its_groups_lag(store):
    await _ready_group(store, "a", version=0, prompt="pa")
    await _ready_group(store, "b", version=1, prompt="pb")
    await store.policy.publish_policy(1.0, 2, None)
    assert await store.batches.form_batch(2.0, 2, 10.0, 4, None, "b1", 100.0) == ("new", "b1")
    stats = json.loads((await store.batches.read_batch("b1"))["stats"])
    assert stats["age_versions_mean"] == 1.5          # 2 and 1 versions behind
    assert (await counters(store))["delivered_lag_versions"] == 3


def test_a_reply_is_read_by_name_live_or_replayed():
    from sara_service.store.results import applied_from_reply
    live = applied_from_reply([b"ok", 2, 1, 0, [b"g1", b"commit", b"g2", b"abandon"], b"r1 r2", 1])
    assert (live.accepted, live.duplicates, live.late, live.released) == (2, 1, 0, 1)
    assert live.decisions == [("g1", "commit"), ("g2", "abandon")] and live.cancel == ["r1", "r2"]
    assert not live.replayed
    # cjson stores an empty list as {}: a replayed answer with no decisions reads as none
    stored = json.dumps([0, 3, 0, {}, "", 0]).encode()
    again = applied_from_reply([b"replay", stored])
    assert again.replayed and again.decisions == [] and again.cancel == [] and again.duplicates == 3
    with pytest.raises(UnknownRollouts):
        applied_from_reply([b"unknown", [b"x:1"]])
