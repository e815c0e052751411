"""tau_low=auto through the API: groups are served, the price in force and the thresholds are
in /stats, and a new price moves the thresholds of the groups opened after it."""

from __future__ import annotations

import hashlib

import pytest

from .conftest import prompt_spec, result_for

pytestmark = pytest.mark.anyio


@pytest.mark.slow  # seconds: the full suite's, not the fast tier's
async def test_auto_serves_groups_and_learns_to_abandon_hopeless_prompts(make_api):
    api = await make_api(tau_low="auto", auto_refit_groups=4)
    await api.add(*[prompt_spec(f"f{i}", "fail") for i in range(24)],
                  *[prompt_spec(f"m{i}", "mixed") for i in range(24)])
    for _ in range(4):  # a few epochs: the pool model learns that "fail" prompts never succeed
        await api.work("w1", 64, rounds=200)
        await api.publish((await api.stats())["policy"]["version"] + 1)
    stats = await api.stats()
    c, auto = stats["counters"], stats["auto_thresholds"]
    assert c["groups_committed"] >= 24 and c["groups_abandoned"] > 0
    assert auto["refits"] > 1 and auto["rho"] > 0
    # half the pool is hopeless: a run of failures is soon not worth continuing
    assert auto["abandon_after_failures"] <= 4
    assert stats["config"]["tau_low"] == "auto"
    metrics = (await api.get("/metrics")).text
    assert "sara_auto_rho{" in metrics and "sara_auto_abandon_after_failures{" in metrics


async def test_thresholds_follow_the_price(make_api):
    api = await make_api(tau_low="auto", auto_refit_groups=1000)
    await api.add(*[prompt_spec(f"p{i}", "mixed") for i in range(8)])
    scheduler = api.app.state.scheduler
    await api.lease("w1", 1)                 # the first lease fits the (empty) pool once
    thresholds = {}
    for rho in (1000.0, 1.5):
        scheduler.auto.set_price(rho)        # what a refit does when the pool's yield moves
        (_, _, plan), = (await scheduler._plans_for(["p7"]))[0]
        thresholds[rho] = (plan.after_failures, plan.after_successes)
        shown = (await api.stats())["auto_thresholds"]
        assert shown["rho"] == rho
        assert (shown["abandon_after_failures"], shown["abandon_after_successes"]) == \
            thresholds[rho]
    assert thresholds[1000.0] == (9, 9)      # a mixed group is worth anything: never abandon
    assert thresholds[1.5] == (1, 1)         # worth little: stop at the first pure result


def _level_of_prompt(rollout: dict) -> float:
    """The reward view's pool: "s*" prompts always give 0.0 (one level: hopeless for a group),
    the others 0.0 or 0.1 by a hash of the rollout id (even odds)."""
    if rollout["prompt_id"].startswith("s"):
        return 0.0
    return 0.1 if hashlib.sha256(rollout["rollout_id"].encode()).digest()[0] % 2 else 0.0


async def _work_levels(api, rounds: int, reward=_level_of_prompt) -> None:
    for _ in range(rounds):
        lease = await api.lease("w1", 64)
        if lease["rollouts"]:
            await api.report("w1", [result_for(r, reward=reward(r)) for r in lease["rollouts"]])
        while (r := await api.next_batch()).status_code == 200:
            await api.ok("POST", f"/batches/{r.json()['batch_id']}/ack")


async def test_auto_under_the_reward_view_learns_that_one_level_prompts_are_not_worth_a_group(
        make_api):
    api = await make_api(effective="reward", reward_tolerance=0.01, tau_low="auto",
                         auto_refit_groups=4, batch_size=4, prefetch_batches=2)
    await api.add(*[prompt_spec(f"s{i}", "fail") for i in range(24)],
                  *[prompt_spec(f"v{i}", "fail") for i in range(24)])
    before = (await api.stats())["auto_thresholds"]
    # the uniform Dirichlet(1, 1) alone never gives up on a run (a new level stays likely)
    assert before["abandon_after_failures"] == 9 and before["reward_levels"] == 2
    for _ in range(4):
        await _work_levels(api, 40)
        await api.publish((await api.stats())["policy"]["version"] + 1)
    stats = await api.stats()
    auto, c = stats["auto_thresholds"], stats["counters"]
    assert auto["refits"] > 1 and auto["rho"] > 0
    # half the pool gives one level only: a run of equal rewards is soon not worth continuing
    assert auto["abandon_after_failures"] <= 4
    assert auto["abandon_after_successes"] == auto["abandon_after_failures"]
    assert c["groups_abandoned"] > 0 and c["groups_committed"] >= 24


async def test_auto_under_the_reward_view_plans_again_for_a_new_level(make_api):
    api = await make_api(effective="reward", reward_tolerance=0.01, tau_low="auto",
                         auto_refit_groups=1000, batch_size=4, prefetch_batches=2)
    await api.add(*[prompt_spec(f"v{i}", "fail") for i in range(8)])
    scheduler = api.app.state.scheduler
    await _work_levels(api, 1, reward=lambda r: 1.0 if r["rollout_id"].endswith("0") else 0.1)
    await _work_levels(api, 1, reward=lambda r: 0.0)
    assert set((await api.stats())["reward_levels"]) == {"0", "10", "100"}
    await scheduler._plans_for(["v0"])       # opening groups refreshes the levels
    assert scheduler.auto.levels == 3
    assert (await api.stats())["auto_thresholds"]["reward_levels"] == 3
