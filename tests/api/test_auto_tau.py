"""tau_low=auto through the API: groups are served, the price in force and the thresholds are
in /stats, and a new price moves the thresholds of the groups opened after it."""

from __future__ import annotations

import pytest

from .conftest import prompt_spec

pytestmark = pytest.mark.anyio


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
