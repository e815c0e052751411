"""Audit sampling in the Lua scripts: an audited group runs on to k where SARA would abandon it,
is delivered when it ends mixed, and every step is counted."""

from __future__ import annotations

import hashlib

import pytest

from sara_client.models import PromptIn
from sara_service.math.allocation import plan_group

from .test_store import SARA8, counters, end_groups, lease, report

pytestmark = pytest.mark.anyio


async def open_one(store, gid, fraction):
    return await store.groups.open_groups(0.0, 100, [(gid, "p", SARA8)], "complete", 0, fraction, 7)


async def group_field(store, gid, field):
    (row,) = await store.groups.read_groups([gid])
    return row[field]


async def test_an_audited_group_runs_on_to_k_and_its_mixed_ending_is_delivered(store):
    assert SARA8.after_failures == 4 and SARA8.initial_issue == 4
    await open_one(store, "g", 1.0)
    await lease(store, "w", 4)
    applied = await report(store, "w", [(f"g:{i}", 0) for i in range(4)])
    assert applied.decisions == [("g", "continue")]  # SARA alone would abandon here
    c = await counters(store)
    assert (c["groups_audited"], c["audit_rollouts"], c.get("groups_abandoned", 0)) == (1, 4, 0)
    assert await group_field(store, "g", "issued") == "8"
    ids, _ = await lease(store, "w", 8, lease_id="L2")
    assert ids == [f"g:{i}" for i in range(4, 8)]
    applied = await report(store, "w", [("g:4", 1)] + [(f"g:{i}", 0) for i in range(5, 8)])
    assert applied.decisions == [("g", "commit")]
    c = await counters(store)
    assert (c["audits_mixed"], c["groups_committed"], c.get("audits_pure", 0)) == (1, 1, 0)
    assert await store.redis.llen(store.keys.ready) == 1


async def test_an_audited_group_that_stays_pure_is_dropped_and_counted(store):
    await open_one(store, "g", 1.0)
    await lease(store, "w", 4)
    await report(store, "w", [(f"g:{i}", 1) for i in range(4)])
    await lease(store, "w", 8, lease_id="L2")
    await report(store, "w", [(f"g:{i}", 1) for i in range(4, 8)])
    c = await counters(store)
    assert (c["audits_pure"], c["groups_completed_pure"], c["groups_dropped_saturated"]) == (1, 1, 1)
    assert c.get("audits_mixed", 0) == 0 and c.get("groups_committed", 0) == 0
    assert await store.redis.llen(store.keys.ready) == 0


async def test_without_audit_the_group_is_abandoned_and_nothing_is_audited(store):
    await open_one(store, "g", 0.0)
    await lease(store, "w", 4)
    applied = await report(store, "w", [(f"g:{i}", 0) for i in range(4)])
    assert applied.decisions == [("g", "abandon")]
    c = await counters(store)
    assert c["groups_abandoned"] == 1 and "groups_audited" not in c
    assert c["rollouts_not_spent_on_abandoned_groups"] == 4


async def test_a_group_committed_before_its_abandonment_point_is_not_an_audit(store):
    await open_one(store, "g", 1.0)
    await lease(store, "w", 4)
    applied = await report(store, "w", [("g:0", 0), ("g:1", 1)])
    assert applied.decisions == [("g", "commit")]
    assert "groups_audited" not in await counters(store)


async def test_the_audit_draw_is_a_fair_share_of_groups_and_fresh_on_each_visit(store):
    prompts = [(f"q{i}", PromptIn(prompt=str(i))) for i in range(2000)]
    await store.prompts.add_prompts(prompts, 1.0, 1.0, 0)
    plan = plan_group("sara", 8, 1.0, 1.0, 0.5)
    groups = [(f"g{i}", f"q{i}", plan) for i in range(2000)]
    await store.groups.open_groups(0.0, 10**9, groups, "complete", 0, 0.1, 3)
    flags = [await group_field(store, gid, "audit") for gid, _, _ in groups]
    audited = flags.count("1")
    assert 200 - 4 * 13.4 < audited < 200 + 4 * 13.4  # binomial(2000, 0.1): sd 13.4
    assert flags == [documented_draw(3, f"q{i}", 0, 0.1) for i in range(2000)]
    # the same seed, prompt and visit give the same draw; the next visit (once the first
    # groups ended: a prompt has one group in flight at a time) draws afresh
    await end_groups(store, *(gid for gid, _, _ in groups))
    again = [(f"h{i}", f"q{i}", plan) for i in range(2000)]
    await store.groups.open_groups(0.0, 10**9, again, "complete", 0, 0.1, 3)
    second = [await group_field(store, gid, "audit") for gid, _, _ in again]
    assert second != flags and 200 - 4 * 13.4 < second.count("1") < 200 + 4 * 13.4
    assert second == [documented_draw(3, f"q{i}", 1, 0.1) for i in range(2000)]


def documented_draw(seed: int, pid: str, visit: int, fraction: float) -> str:
    """_open.lua's audit flag as its comment (and the allocation bench's model) state it: the
    first 48 bits of sha1("seed:prompt:visit") below the fraction. A replica or model drawing
    otherwise would audit other groups than the one it agrees with."""
    digest = hashlib.sha1(f"{seed}:{pid}:{visit}".encode()).hexdigest()
    return "1" if int(digest[:12], 16) / 2**48 < fraction else "0"
