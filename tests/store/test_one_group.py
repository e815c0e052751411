"""The one-group-per-prompt rule, Lua against Python, case by case: for a prompt whose newest
group is in each lifecycle state (or gone), `GroupStore.busy_prompts` (what the scheduler's draw
reads) and `open_groups.lua` / `lease.lua` (which decide atomically) agree on whether a new group
may open on it. Runs on one Redis and on a three-master Redis Cluster."""

from __future__ import annotations

import pytest

from sara_client.models import PromptIn
from sara_service.math.allocation import plan_group
from sara_service.store.leases import Opening
from sara_service.store.redis_format import BUSY_GROUP_STATES, GROUP_STATES
from sara_service.store.store import Store

pytestmark = pytest.mark.anyio

SARA8 = plan_group("sara", 8, 1.0, 1.0, 0.5)
CASES = [*GROUP_STATES, "gone"]   # "gone": its state collected, or lost


async def _with_newest_group_in(store: Store, state: str) -> None:
    """Prompt "q" with one group, "g0", whose state is then set to `state` (or deleted)."""
    await store.prompts.add_prompts([("q", PromptIn(prompt="question q"))], 1.0, 1.0, 0)
    assert await store.groups.open_groups(0.0, 100, [("g0", "q", SARA8)], "complete") == 1
    if state == "gone":
        await store.redis.hdel(store.keys.group_states, "g0")
    else:
        await store.redis.hset(store.keys.group_states, "g0", state)


@pytest.mark.parametrize("state", CASES)
async def test_the_draw_and_open_groups_agree_on_a_busy_prompt(store, state):
    await _with_newest_group_in(store, state)
    busy = state in BUSY_GROUP_STATES
    (post,) = await store.prompts.posteriors(["q"])
    assert post.last_group == "g0"
    assert await store.groups.busy_prompts({"q": post}) == ({"q"} if busy else set())
    before = int(await store.redis.hget(store.keys.stats, "prompts_skipped_busy") or 0)
    consumed = await store.groups.open_groups(0.0, 100, [("g1", "q", SARA8)], "complete")
    assert consumed == 1                        # a busy prompt is passed over, not kept
    assert (await store.groups.group_state(["g1"]))[0] == (None if busy else "open")
    after = int(await store.redis.hget(store.keys.stats, "prompts_skipped_busy") or 0)
    assert after - before == busy


@pytest.mark.parametrize("state", CASES)
async def test_the_lease_script_agrees_too(store, state):
    await _with_newest_group_in(store, state)
    await store.runner.run("refill_epoch", dict(seen_epoch=0, prompt_ids="q"))
    await store.redis.delete(store.keys.pending)   # g0's own probes are not what is asked here
    grant = await store.leases.lease_with_policy(
        1.0, "w", "L1", 4, 50.0, 100, "", flow_target=100,
        opening=Opening(SARA8, "complete", 0.0, 0, ("g1",)))
    opened = {r.group_id for r in grant.rollouts}
    assert opened == (set() if state in BUSY_GROUP_STATES else {"g1"})


async def test_two_groups_for_one_prompt_in_one_call_open_one(store):
    consumed = await store.groups.open_groups(
        0.0, 100, [("g1", "p", SARA8), ("g2", "p", SARA8)], "complete")
    assert consumed == 2
    assert await store.groups.group_state(["g1", "g2"]) == ["open", None]


async def test_the_lua_busy_states_are_the_formats(store):
    """_open.lua's BUSY table names exactly redis_format.BUSY_GROUP_STATES."""
    from importlib.resources import files

    source = files("sara_service.store").joinpath("lua/_open.lua").read_text()
    line = next(x for x in source.splitlines() if x.startswith("local BUSY = "))
    named = {part.split("=")[0].strip() for part in line[line.index("{") + 1:
                                                          line.index("}")].split(",")}
    assert named == set(BUSY_GROUP_STATES)
