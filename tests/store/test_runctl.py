"""Run control in the Lua scripts: disabled prompts never open, a paused run leases nothing,
a draining run opens nothing and delivers its last groups however few."""

from __future__ import annotations

import pytest

from sara_client.models import PromptIn
from sara_service.errors import NotFound
from sara_service.store.codec import StoredPosterior

from .test_store import SARA8, UNI8, counters, lease, report

pytestmark = pytest.mark.anyio


async def test_a_disabled_prompt_is_passed_over_and_enabled_again(store):
    assert await store.prompts.set_prompt_state("disable", "p") == "disabled"
    consumed = await store.groups.open_groups(0.0, 100, [("g1", "p", SARA8)], "complete")
    assert consumed == 1  # consumed (the epoch does not get it back) but not opened
    assert await store.groups.group_state(["g1"]) == [None]
    assert await store.prompts.set_prompt_state("enable", "p") == "enabled"
    await store.groups.open_groups(0.0, 100, [("g2", "p", SARA8)], "complete")
    assert await store.groups.group_state(["g2"]) == ["open"]


async def test_disabling_keeps_the_groups_in_flight_running(store):
    await store.groups.open_groups(0.0, 100, [("g", "p", UNI8)], "complete")
    await store.prompts.set_prompt_state("disable", "p")
    ids, _ = await lease(store, "w1", 8)
    assert len(ids) == 8
    await report(store, "w1", [(rid, i % 2) for i, rid in enumerate(ids)])
    assert await store.groups.group_state(["g"]) == ["ready"]


async def test_a_deleted_prompt_leases_and_batches_its_groups_in_flight(store):
    await store.groups.open_groups(0.0, 100, [("g", "p", UNI8)], "complete")
    assert await store.prompts.set_prompt_state("delete", "p") == "deleted"
    with pytest.raises(NotFound):
        await store.prompts.get_prompt("p")
    rollouts, _ = await store.leases.lease(0.0, "w1", "L1", 8, 10.0, 100, "sim")
    assert [r.prompt["prompt"] for r in rollouts] == ["q"] * 8
    assert await store.prompts.read_prompts(["p"]) == [{"prompt": "q", "answer": None, "task": "exact",
                                                "meta": {}}]
    await store.groups.open_groups(0.0, 100, [("g2", "p", UNI8)], "complete")
    assert await store.groups.group_state(["g2"]) == [None]
    with pytest.raises(NotFound):
        await store.prompts.set_prompt_state("enable", "p")
    # adding the id again registers it afresh, enabled
    assert await store.prompts.add_prompts([("p", PromptIn(prompt="new"))], 1.0, 1.0, 0) == (1, [])
    await store.groups.open_groups(0.0, 100, [("g3", "p", UNI8)], "complete")
    assert await store.groups.group_state(["g3"]) == ["open"]


async def test_unknown_prompt_state_change_is_not_found(store):
    with pytest.raises(NotFound):
        await store.prompts.set_prompt_state("disable", "nope")


async def test_paused_run_opens_and_leases_nothing_but_accepts_results(store):
    await store.groups.open_groups(0.0, 100, [("g", "p", UNI8)], "complete")
    ids, _ = await lease(store, "w1", 4)
    await store.run.set_run_state("pause")
    assert await store.run.run_state() == "paused"
    assert await store.groups.open_groups(0.0, 100, [("g2", "p", UNI8)], "complete") == 0
    assert (await lease(store, "w2", 4, lease_id="L2"))[0] == []
    applied = await report(store, "w1", [(rid, 1) for rid in ids])
    assert applied.accepted == 4
    await store.run.set_run_state("resume")
    assert await store.run.run_state() == "running"
    assert len((await lease(store, "w2", 8, lease_id="L3"))[0]) == 4  # the pending rest


async def test_draining_run_delivers_a_short_last_batch_then_reports_drained(store):
    await store.groups.open_groups(0.0, 100, [("g", "p", UNI8)], "complete")
    await store.run.set_run_state("drain")
    assert await store.groups.open_groups(0.0, 100, [("g2", "p", UNI8)], "complete") == 0
    ids, _ = await lease(store, "w1", 8)
    assert len(ids) == 8  # draining still leases: in-flight work finishes
    assert await store.run.run_state() == "draining"
    await report(store, "w1", [(rid, i % 2) for i, rid in enumerate(ids)])
    kind, bid = await store.batches.form_batch(2.0, 4, 100.0, 10, None, "b1", 100.0)
    assert kind == "new"  # one group for a batch of four: nothing more is coming
    assert await store.run.run_state() == "draining"
    await store.batches.ack(3.0, bid, 100.0)
    assert await store.run.run_state() == "drained"
    assert (await counters(store))["groups_opened"] == 1


async def test_running_run_does_not_form_a_short_batch(store):
    await store.groups.open_groups(0.0, 100, [("g", "p", UNI8)], "complete")
    ids, _ = await lease(store, "w1", 8)
    await report(store, "w1", [(rid, i % 2) for i, rid in enumerate(ids)])
    assert (await store.batches.form_batch(2.0, 4, 100.0, 10, None, "b1", 100.0))[0] == "none"


async def test_listing_pages_with_a_cursor_and_shows_state_and_posterior(store):
    await store.prompts.add_prompts([(f"q{i}", PromptIn(prompt=str(i))) for i in range(30)], 1, 1, 0)
    await store.prompts.set_prompt_state("disable", "q3")
    seen, cursor = {}, 0
    while True:
        cursor, page = await store.prompts.list_prompts(cursor, 7)
        seen.update({p.prompt_id: p for p in page})
        if cursor == 0:
            break
    assert len(seen) == 31
    assert seen["q3"].state == "disabled" and seen["q4"].state == "enabled"
    assert seen["q4"].posterior == StoredPosterior(alpha=1.0, beta=1.0, version=0)
