"""SARA_POLICY=reinforce_ada through the HTTP API on a real Redis: groups are sampled in rounds,
stop once their rule's successes and failures are in, and are delivered down-sampled to
SARA_ADA_KEEP, balanced; a prompt that never succeeds spends its whole budget and is dropped."""

from __future__ import annotations

import pytest

from .conftest import prompt_spec, slot_of, sync_round

pytestmark = pytest.mark.anyio

E, H, Z = 4, 4, 2    # prompts: easy (mixed from the first round), hard (late successes), zero


def reward(rollout: dict) -> float:
    slot, kind = slot_of(rollout["rollout_id"]), rollout["prompt_id"][0]
    if kind == "e":
        return float(slot % 2)
    if kind == "h":
        return float(slot in (9, 13))     # one success in round 3, the second in round 4
    return 0.0


async def _round(api, delivered: list[dict]) -> int:
    return await sync_round(api, reward, delivered, 16)


async def _run(api) -> list[dict]:
    """A few epochs of the pool, then a drain: every opened group ends decided."""
    delivered: list[dict] = []
    for _ in range(30):
        await _round(api, delivered)
    await api.ok("POST", "/run", {"action": "drain"})
    while await _round(api, delivered):
        pass
    return delivered


async def test_rounds_stop_on_balanced_signal_and_deliver_kept_rollouts(make_api):
    api = await make_api(policy="reinforce_ada", group_size=16, ada_round=4, ada_keep=4,
                         batch_size=2, prefetch_batches=4)
    await api.add(*[prompt_spec(f"e{i}", "mixed") for i in range(E)],
                  *[prompt_spec(f"h{i}", "fail") for i in range(H)],
                  *[prompt_spec(f"z{i}", "fail") for i in range(Z)])
    delivered = await _run(api)
    for group in delivered:   # kept: two successes and two failures, the earliest of each
        slots = [slot_of(r["rollout_id"]) for r in group["rollouts"]]
        assert sorted(r["reward"] for r in group["rollouts"]) == [0.0, 0.0, 1.0, 1.0]
        # easy ones stop after round 1, hard ones after round 4 (successes at 9 and 13)
        assert slots == ([0, 1, 2, 3] if group["prompt_id"][0] == "e" else [0, 1, 9, 13])
        # a kept group carries every reward it drew (its baseline's pool); one whose every
        # rollout is delivered carries none
        if group["prompt_id"][0] == "e":
            assert group["drawn_rewards"] is None
        else:
            assert group["drawn_rewards"] == [float(slot in (9, 13)) for slot in range(16)]
    assert {g["prompt_id"][0] for g in delivered} == {"e", "h"}
    for kind, count, spent in (("e", E, 4), ("h", H, 16), ("z", Z, 16)):
        for i in range(count):
            history = (await api.prompt(f"{kind}{i}"))["history"]
            assert history["groups"] >= 1
            # every rollout a group drew is spent: 4 for an easy one, the whole budget else
            assert history["rollouts"] == spent * history["groups"], (kind, history)
            assert history["committed"] == (history["groups"] if kind != "z" else 0)
    c = (await api.stats())["counters"]
    assert c["groups_abandoned"] == 0 and c["groups_dropped_saturated"] > 0
    assert c["groups_delivered"] == len(delivered)


async def test_reinforce_ada_refuses_rounds_that_do_not_fit_the_budget(make_app):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="multiple of the round"):
        make_app(policy="reinforce_ada", group_size=30, ada_round=8)
    with pytest.raises(ValidationError, match="leave SARA_PRIOR=uniform"):
        make_app(policy="reinforce_ada", group_size=32, prior="history")
