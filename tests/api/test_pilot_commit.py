"""SARA_POLICY=pilot_commit through the HTTP API on a real Redis: each prompt gets a pilot; one
whose pilot pass rate lies in the band is filled to k and delivered whole (the pilot in it); one
outside the band is abandoned after its pilot and comes back next epoch; one whose whole pilot
succeeded is never sampled again."""

from __future__ import annotations

import pytest

from .conftest import prompt_spec, slot_of, sync_round

pytestmark = pytest.mark.anyio

PILOT, K = 4, 16


def reward(rollout: dict) -> float:
    slot, kind = slot_of(rollout["rollout_id"]), rollout["prompt_id"][0]
    if kind == "e":
        return float(slot % 2)           # a pilot of 2/4: in the band
    if kind == "t":
        return float(slot != 0)          # 3/4: mixed, but above the band
    return 1.0 if kind == "s" else 0.0   # solved; hopeless


async def _round(api, delivered: list[dict]) -> int:
    return await sync_round(api, reward, delivered, 32)


async def test_pilots_commit_in_band_abandon_outside_it_and_exclude_solved_prompts(make_api):
    api = await make_api(policy="pilot_commit", group_size=K, pc_pilot=PILOT, pc_band_low=0.25,
                         pc_band_high=0.5, batch_size=1, prefetch_batches=4)
    await api.add(*[prompt_spec(f"{kind}{i}", "fail") for kind in "etsz" for i in range(2)])
    delivered: list[dict] = []
    for _ in range(40):
        await _round(api, delivered)
    await api.ok("POST", "/run", {"action": "drain"})   # every opened group ends decided
    while await _round(api, delivered):
        pass
    assert delivered and {g["prompt_id"][0] for g in delivered} == {"e"}
    for group in delivered:   # the pilot and the commit, one group of k
        assert sorted(slot_of(r["rollout_id"]) for r in group["rollouts"]) == list(range(K))
    history = {kind: [(await api.prompt(f"{kind}{i}"))["history"] for i in range(2)]
               for kind in "etsz"}
    for h in history["s"]:     # one pilot, then excluded for the run
        assert (h["groups"], h["rollouts"], h["committed"]) == (1, PILOT, 0)
    for kind in "tz":          # dropped for now, drawn again in later epochs: pilots only
        for h in history[kind]:
            assert h["groups"] >= 2 and h["rollouts"] == PILOT * h["groups"]
            assert h["committed"] == 0
    for h in history["e"]:
        assert h["groups"] >= 2 and h["rollouts"] == K * h["groups"] == K * h["committed"]
    c = (await api.stats())["counters"]
    assert c["groups_abandoned"] == sum(h["groups"] for kind in "tsz" for h in history[kind])
    assert c["groups_skipped"] > 0      # the solved prompts, skipped at each later draw


async def test_pilot_commit_refuses_a_pilot_or_band_that_cannot_run(make_app):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="larger than the pilot"):
        make_app(policy="pilot_commit", group_size=8, pc_pilot=8)
    with pytest.raises(ValidationError, match="every committed pilot is mixed"):
        make_app(policy="pilot_commit", group_size=32, pc_pilot=8, pc_band_low=0.0)
    with pytest.raises(ValidationError, match="leave SARA_PRIOR=uniform"):
        make_app(policy="pilot_commit", group_size=32, tau_low="auto")
    with pytest.raises(ValidationError, match="SARA_PC_TAU_LOW: .*before its first rollout"):
        make_app(policy="pilot_commit", group_size=32, pc_pilot=8, pc_tau_low=1.0)
