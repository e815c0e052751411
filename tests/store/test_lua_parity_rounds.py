"""Groups sampled in rounds (SARA_POLICY=reinforce_ada): the Lua scripts decide and issue
exactly as the Python reference (`reinforce_ada.decide_round`, `next_issue`), case by case,
as test_lua_parity.py checks the other policies."""

from __future__ import annotations

import random

import pytest

from sara_client.models import RolloutResult
from sara_service.math.reinforce_ada import decide_round, next_issue, plan_rounds, round_rule
from sara_service.store.redis_format import GroupField
from tests.store._apply import apply_results

pytestmark = pytest.mark.anyio


def reference(k: int, rule, outcomes: list[bool]) -> dict:
    """Decisions and issued counts after each outcome, fed in slot order until decided."""
    issued, seen, steps, final = rule.size, [], [], "open"
    for outcome in outcomes:
        if len(seen) >= issued or final != "open":
            break
        seen.append(outcome)
        decision = decide_round(seen, issued, k, rule)
        if decision == "continue":
            issued = next_issue(len(seen), issued, k, rule)
            if len(seen) >= k:
                final = "saturated"
        else:
            final = {"commit": "committed", "abandon": "abandoned"}[decision]
        steps.append((outcome, decision, issued))
    return {"steps": steps, "final": final}


def cases(count: int = 120) -> list[tuple]:
    rng = random.Random(27)
    out = []
    for _ in range(count):
        size, rounds = rng.choice([2, 4, 8]), rng.randint(1, 4)
        keep = rng.randint(2, min(8, size * rounds))
        rule = round_rule(size, keep, rng.choice(["balanced", "balanced", "positive"]))
        rate = rng.choice([0.0, 0.02, 0.1, 0.5, 0.9, 1.0])
        outcomes = [rng.random() < rate for _ in range(size * rounds)]
        out.append((size * rounds, rule, outcomes))
    return out


CASES = cases()


@pytest.fixture
def redis_url(single_redis_url) -> str:
    return single_redis_url


def test_cases_cover_every_ending():
    assert {reference(*c)["final"] for c in CASES} == {"committed", "abandoned", "saturated"}
    assert any(len(reference(*c)["steps"]) > c[1].size for c in CASES)   # later rounds ran


@pytest.mark.parametrize("index", range(len(CASES)))
async def test_lua_rounds_match_the_reference(store, index):
    k, rule, outcomes = CASES[index]
    want = reference(k, rule, outcomes)
    plan = plan_rounds(k, 1.0, 1.0, rule)
    gid = f"r{index}"
    assert await store.groups.open_groups(0.0, 10**9, [(gid, "p", plan)], "partial") == 1
    for n, (outcome, decision, issued) in enumerate(want["steps"]):
        result = RolloutResult(rollout_id=f"{gid}:{n}", reward=float(outcome))
        applied = await apply_results(store, 1.0, "w", [result], [int(outcome)], 1.0, 1.0,
                                                   1.0, 60.0)
        assert applied.decisions == [(gid, decision)], f"after {outcomes[:n + 1]}"
        (row,) = await store.groups.read_groups([gid])
        assert int(row[GroupField.issued]) == issued
    (state,) = await store.groups.group_state([gid])
    expected = {"committed": {"ready"}, "abandoned": {"abandoned"}, "saturated": {"dropped"},
                "open": {"open"}}
    assert state in expected[want["final"]]
