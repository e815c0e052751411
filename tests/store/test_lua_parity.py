"""The Lua scripts decide exactly as the Python reference (`allocation.decide`) does.

Each shared case (tests/allocation_cases.py) opens one group in Redis with the plan the scheduler
would compute, feeds it the case's outcomes one result call at a time, and compares the script's
decision and the group's issued count after every outcome with the reference's.
"""

from __future__ import annotations

import pytest

from sara_client.models import RolloutResult
from sara_service.math.allocation import plan_group
from sara_service.store.redis_format import GroupField
from tests.store._apply import apply_results
from tests.allocation_cases import generate_cases

pytestmark = pytest.mark.anyio

CASES = generate_cases(seed=0, count=300)
FINAL_STATES = {"committed": {"committed", "ready"}, "abandoned": {"abandoned"}}


@pytest.fixture
def redis_url(single_redis_url) -> str:
    """One server only: these 300 cases check the scripts' arithmetic, which a cluster node runs
    the same; the store's other tests run every script on the cluster too."""
    return single_redis_url


def _final_states(case: dict) -> set[str]:
    if case["final"] == "saturated":
        return {"ready"} if case["policy"] == "uniform" else {"dropped"}
    return FINAL_STATES[case["final"]]


async def _issued(store, gid: str) -> int:
    (row,) = await store.groups.read_groups([gid])
    return int(row[GroupField.issued])


async def test_cases_cover_every_kind_of_ending():
    finals = {c["final"] for c in CASES}
    assert finals == {"committed", "abandoned", "saturated", "skipped"}
    assert {c["policy"] for c in CASES} == {"sara", "uniform", "dynamic_sampling"}


@pytest.mark.parametrize("index", range(len(CASES)))
async def test_lua_matches_python_reference(store, index):
    case = CASES[index]
    plan = plan_group(case["policy"], case["k"], case["alpha0"], case["beta0"], case["tau_low"])
    assert plan.skip == case["skip"]
    if plan.skip:
        return  # the scheduler never opens a skipped group: nothing reaches Lua
    gid = f"g{index}"
    opened = await store.groups.open_groups(0.0, 10**9, [(gid, "p", plan)], "complete")
    assert opened == 1
    assert await _issued(store, gid) == case["initial_issue"]
    for n, (outcome, decision, issued) in enumerate(
            zip(case["outcomes"], case["decisions"], case["issued_after"])):
        assert n < await _issued(store, gid), "an outcome arrived for a rollout never issued"
        result = RolloutResult(rollout_id=f"{gid}:{n}", reward=float(outcome))
        applied = await apply_results(store, 1.0, "w", [result], [outcome], 0.5, case["alpha0"],
                                            case["beta0"], 60.0)
        assert applied.accepted == 1
        assert applied.decisions == [(gid, decision)], f"after outcomes {case['outcomes'][:n + 1]}"
        assert await _issued(store, gid) == issued
    (state,) = await store.groups.group_state([gid])
    assert state in _final_states(case)
