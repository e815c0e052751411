"""One group per prompt at a time, under every policy and selection, on a pool smaller than the
flow target: no prompt ever has two groups in flight (open, committed or ready), no batch holds
two groups of one prompt, and a pool smaller than a batch says so in /stats and the log instead
of hanging silently. Every test runs on one Redis and on a three-master Redis Cluster."""

from __future__ import annotations

import logging
import random

import pytest

from sara_service.core.observability import small_pool_warning

from .conftest import prompt_spec, result_for

pytestmark = pytest.mark.anyio

IN_FLIGHT = ("open", "committed", "ready")
# (settings) of every allocation policy and prompt selection
CASES = {
    "sara-epoch": dict(policy="sara"),
    "ds-epoch": dict(policy="dynamic_sampling"),
    "uniform-epoch": dict(policy="uniform"),
    "sara-history": dict(policy="sara", selection="history", prior="history", tau_skip=0.05),
    "sara-dps": dict(policy="sara", selection="dps"),
    "ds-dps-per-opening": dict(policy="dynamic_sampling", selection="dps",
                               selection_rank="opening"),
    "sara-mopps": dict(policy="sara", selection="mopps"),
    "ds-greso": dict(policy="dynamic_sampling", selection="greso"),
    "sara-auto": dict(policy="sara", tau_low="auto"),
    "sara-var-k": dict(policy="sara", group_sizing="var_k", vk_min=2, vk_max=16, vk_batch=4),
    "reinforce-ada": dict(policy="reinforce_ada", group_size=8, ada_round=4, ada_keep=4),
    "pilot-commit": dict(policy="pilot_commit", group_size=16, pc_pilot=8),
}
SCRIPTS = ("mixed", "fail", "success")


async def _in_flight_by_prompt(api, seen: dict[str, str]) -> dict[str, list[str]]:
    """Prompt id -> its groups in flight now, over every group id seen in a lease."""
    out: dict[str, list[str]] = {}
    for gid, pid in seen.items():
        r = await api.get(f"/groups/{gid}")
        if r.status_code == 200 and r.json()["state"] in IN_FLIGHT:
            out.setdefault(pid, []).append(gid)
    return out


@pytest.mark.parametrize("case", list(CASES))
async def test_no_prompt_has_two_groups_in_flight_and_no_batch_repeats_one(make_api, case):
    # six prompts, eight groups wanted in flight (batch 2 x prefetch 4): every prompt is asked
    # for more often than one group at a time allows
    api = await make_api(batch_size=2, prefetch_batches=4, max_staleness=100, **CASES[case])
    await api.add(*(prompt_spec(f"p{i}", SCRIPTS[i % 3]) for i in range(6)))
    rng = random.Random(7)
    seen: dict[str, str] = {}
    batches = 0
    for step in range(30):
        lease = await api.lease(rng.choice(["w1", "w2"]), rng.choice([2, 5, 16]))
        seen.update({r["group_id"]: r["prompt_id"] for r in lease["rollouts"]})
        busy = await _in_flight_by_prompt(api, seen)
        assert all(len(g) == 1 for g in busy.values()), (step, busy)
        held = lease["rollouts"]
        rng.shuffle(held)
        if held:   # report part of what was leased now, the rest at the next step's report
            await api.report("w1", [result_for(r) for r in held])
        while (r := await api.next_batch()).status_code == 200:
            prompts = [g["prompt_id"] for g in r.json()["groups"]]
            assert len(prompts) == len(set(prompts)), prompts
            await api.ok("POST", f"/batches/{r.json()['batch_id']}/ack")
            batches += 1
        await api.publish(step + 1)
    assert batches > 0
    counters = await api.counters()
    assert counters["groups_opened"] > 6          # prompts came back once their groups ended


async def test_a_prompt_is_free_again_once_its_group_is_delivered(make_api):
    api = await make_api(batch_size=1, prefetch_batches=4)
    await api.add(prompt_spec("only", "mixed"))
    first = await api.lease("w1", 64)
    assert {r["prompt_id"] for r in first["rollouts"]} == {"only"}
    assert (await api.lease("w1", 64))["rollouts"] == []        # its group is still open
    await api.report("w1", [result_for(r) for r in first["rollouts"]])
    rest = await api.lease("w1", 64)                            # committed: filled to k
    await api.report("w1", [result_for(r) for r in rest["rollouts"]])
    assert (await api.lease("w1", 64))["rollouts"] == []        # ready, not yet delivered
    assert (await api.counters())["prompts_skipped_busy"] > 0
    batch = await api.next_batch()
    assert batch.status_code == 200
    again = await api.lease("w1", 64)                           # delivered: free again
    assert {r["prompt_id"] for r in again["rollouts"]} == {"only"}
    assert again["rollouts"][0]["group_id"] != first["rollouts"][0]["group_id"]


async def test_an_abandoned_group_frees_its_prompt_at_once(make_api):
    api = await make_api(batch_size=1, prefetch_batches=4)
    await api.add(prompt_spec("hard", "fail"))
    first = await api.lease("w1", 64)
    await api.report("w1", [result_for(r) for r in first["rollouts"]])
    assert (await api.group(first["rollouts"][0]["group_id"]))["state"] == "abandoned"
    assert {r["prompt_id"] for r in (await api.lease("w1", 64))["rollouts"]} == {"hard"}


async def test_a_pool_smaller_than_a_batch_says_so_and_what_to_change(make_api, caplog):
    api = await make_api(batch_size=4, prefetch_batches=2)
    await api.add(*(prompt_spec(f"p{i}", "mixed") for i in range(3)))
    warnings = (await api.stats())["warnings"]
    assert warnings == [small_pool_warning(3, 4)]
    assert "SARA_BATCH_SIZE=4" in warnings[0] and "at most 3" in warnings[0]
    with caplog.at_level(logging.WARNING, logger="sara.service"):
        await api.app.state.scheduler.maintain()
        await api.app.state.scheduler.maintain()     # logged once, not on every tick
    said = [r.getMessage() for r in caplog.records if "enabled prompts" in r.getMessage()]
    assert said == [small_pool_warning(3, 4)]
    # disabling a prompt counts; adding enough clears it
    await api.ok("PATCH", "/prompts/p0", {"enabled": False})
    assert (await api.stats())["warnings"] == [small_pool_warning(2, 4)]
    await api.add(*(prompt_spec(f"q{i}", "mixed") for i in range(2)))
    assert (await api.stats())["warnings"] == []
