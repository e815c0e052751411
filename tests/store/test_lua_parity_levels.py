"""Under SARA_EFFECTIVE=reward the Lua scripts decide exactly as the Python reference does
(`reward_levels.decide_levels` and the plan's thresholds), case by case, as
test_lua_parity.py checks the outcome view.

Each case opens one group with the plan the scheduler would compute (`plan_levels`), feeds it
a sequence of reward levels one result call at a time, and compares the script's decision, the
group's issued count and its stored p_eff after every result with the reference's; an abandoned
group's estimate of a false abandon is checked against `mixed_chance_levels`.
"""

from __future__ import annotations

import random

import pytest

from sara_client.models import RolloutResult
from sara_service.store.redis_format import GroupField
from sara_service.math.reward_levels import (
    decide_levels, decide_levels_history, level_table, mixed_chance_levels, plan_levels,
    plan_levels_history,
)
from tests.store._apply import apply_results

pytestmark = pytest.mark.anyio

LABELS = ["0", "100000", "1000000", "-3", "7"]
EDGES = [("sara", 8, 3, 1.0, 0.5), ("sara", 8, 2, 1.0, 0.5), ("sara", 4, 5, 0.5, 0.8),
         ("dynamic_sampling", 8, 3, 1.0, 0.5), ("uniform", 4, 2, 1.0, 0.5),
         ("sara", 16, 2, 0.1, 0.3), ("sara", 8, 4, 3.0, 0.0)]


def walk(plan, k: int, stream: list[str], decide) -> dict:
    """What the engine should do with `stream` under `plan`, fed in slot order until the group
    is decided or has no issued rollout left to report: per result (level, decision, issued
    after it, the stored p_eff or None once committed). A run's threshold and table are its
    level's own (`GroupPlan.by_level`), else the plan's default; `decide(seen)` is the pure
    rule's decision, checked against the plan's at every pure prefix."""
    own = {label: (thr, table) for label, thr, table in plan.by_level}
    issued, seen, steps, final = plan.initial_issue, [], [], "saturated"
    for level in stream:
        if len(seen) >= issued or final in ("committed", "abandoned"):
            break
        seen.append(level)
        n = len(seen)
        thr, table = own.get(seen[0], (plan.after_failures, plan.p_eff_fail))
        if len(set(seen)) >= 2:
            decision, issued, final, p = "commit", k, "committed", None
        elif n >= thr:
            decision, final, p = "abandon", "abandoned", table[min(n, thr, k)]
        else:
            decision, issued, p = "continue", max(issued, min(thr, k)), table[n]
        if decide is not None and final != "committed":
            assert decide(seen) == decision
        steps.append((level, decision, issued, p))
    if final == "saturated" and len(seen) < k:
        final = "open"
    return {"plan": plan, "steps": steps, "final": final}


def reference(policy: str, k: int, levels: int, alpha0: float, tau: float,
              stream: list[str]) -> dict:
    """The shared plan of the symmetric Dirichlet (`plan_levels`): one table for every level."""
    plan = plan_levels(policy, k, levels, alpha0, tau)
    assert plan.after_failures == plan.after_successes and not plan.by_level
    table = level_table(k, levels, alpha0)
    assert plan.p_eff_fail == tuple(table[:len(plan.p_eff_fail)])   # the exact table
    decide = ((lambda seen: decide_levels(seen, k, levels, alpha0, tau)) if policy == "sara"
              else None)
    return walk(plan, k, stream, decide)


def cases(count: int = 160) -> list[tuple]:
    rng = random.Random(26)
    out = []
    for i in range(count):
        if i < len(EDGES):
            policy, k, levels, alpha0, tau = EDGES[i]
        else:
            policy = rng.choice(["sara", "sara", "sara", "dynamic_sampling", "uniform"])
            k, levels = rng.choice([2, 3, 4, 8, 16]), rng.randint(2, 5)
            alpha0, tau = 10 ** rng.uniform(-1, 1), rng.choice([0.0, 0.3, 0.5, 0.7, 0.9])
        if plan_levels(policy, k, levels, alpha0, tau).skip:
            continue
        pure = rng.random() < 0.5
        first = rng.choice(LABELS)
        stream = [first if pure or rng.random() < 0.8 else rng.choice(LABELS) for _ in range(k)]
        out.append((policy, k, levels, alpha0, tau, stream))
    return out


CASES = cases()


@pytest.fixture
def redis_url(single_redis_url) -> str:
    """One server: the cases check the scripts' arithmetic, which a cluster node runs the same."""
    return single_redis_url


async def _group(store, gid: str) -> dict:
    (row,) = await store.groups.read_groups([gid])
    return row


def test_cases_cover_every_ending():
    finals = {reference(*c)["final"] for c in CASES}
    assert {"committed", "abandoned", "saturated"} <= finals
    assert {c[0] for c in CASES} == {"sara", "uniform", "dynamic_sampling"}


@pytest.mark.parametrize("index", range(len(CASES)))
async def test_lua_matches_the_reward_view_reference(store, index):
    policy, k, levels, alpha0, tau, stream = CASES[index]
    want = reference(policy, k, levels, alpha0, tau, stream)
    table = level_table(k, levels, alpha0)
    gid = f"g{index}"
    assert await store.groups.open_groups(0.0, 10**9, [(gid, "p", want["plan"])], "complete") == 1
    assert int((await _group(store, gid))[GroupField.issued]) == want["plan"].initial_issue
    for n, (level, decision, issued, p) in enumerate(want["steps"]):
        result = RolloutResult(rollout_id=f"{gid}:{n}", reward=float(n % 2))
        applied = await apply_results(store, 1.0, "w", [result], [n % 2], 1.0, alpha0, alpha0,
                                            60.0, levels=[level], levels_in_use=levels)
        assert applied.decisions == [(gid, decision)], f"after levels {stream[:n + 1]}"
        row = await _group(store, gid)
        assert int(row[GroupField.issued]) == issued
        if p is not None:   # the stored p_eff is the plan's entry, to the bit
            assert float(row[GroupField.p_eff]) == p == table[min(n + 1, want["plan"].after_failures)]
    (state,) = await store.groups.group_state([gid])
    expected = {"committed": {"committed", "ready"}, "abandoned": {"abandoned"}, "open": {"open"},
                "saturated": {"ready"} if policy == "uniform" else {"dropped"}}
    assert state in expected[want["final"]]
    if want["final"] == "abandoned":
        n = len(want["steps"])
        counts = {stream[0]: float(n)}
        q = mixed_chance_levels(counts, stream[0], k - n, levels, alpha0)
        c = await store.run.counters()
        assert float(c["estimated_false_abandons"]) == pytest.approx(q, rel=1e-12, abs=1e-15)
        assert float(c["expected_false_abandons"]) == table[n]


# --- per-prompt plans (SARA_PRIOR=history): a threshold and table per level the prompt produced


def reference_history(k: int, levels: int, alpha0: float, tau: float, counts: dict[str, float],
                      stream: list[str]) -> dict:
    """As `reference`, under the prompt's own Dirichlet (`plan_levels_history`)."""
    plan = plan_levels_history("sara", k, counts, levels, alpha0, tau)
    return walk(plan, k, stream,
                lambda seen: decide_levels_history(seen, k, counts, levels, alpha0, tau))


def history_cases(count: int = 120) -> list[tuple]:
    rng = random.Random(2626)
    out = []
    for _ in range(count):
        k, levels = rng.choice([3, 4, 8, 16]), rng.randint(2, 4)
        alpha0, tau = 10 ** rng.uniform(-1, 0.5), rng.choice([0.3, 0.5, 0.7])
        produced = rng.sample(LABELS, rng.randint(1, 3))
        counts = {x: round(rng.uniform(0.2, 12.0), 3) for x in produced}
        if plan_levels_history("sara", k, counts, levels, alpha0, tau).skip:
            continue
        first = rng.choice(produced + [rng.choice(LABELS)])
        pure = rng.random() < 0.6
        stream = [first if pure or rng.random() < 0.8 else rng.choice(LABELS) for _ in range(k)]
        out.append((k, levels, alpha0, tau, counts, stream))
    return out


HISTORY_CASES = history_cases()


def test_history_cases_cover_every_ending_and_levels_with_their_own_threshold():
    wants = [reference_history(*c) for c in HISTORY_CASES]
    assert {"committed", "abandoned", "saturated", "open"} & {w["final"] for w in wants} >= {
        "committed", "abandoned"}
    # some runs end on their level's own threshold, different from the default's
    own_differs = [w for w, c in zip(wants, HISTORY_CASES) if w["final"] == "abandoned"
                   and len(w["steps"]) != w["plan"].after_failures]
    assert len(own_differs) >= 10


def test_a_prompt_that_nearly_always_gives_one_level_gets_per_level_thresholds():
    # 0.1 seen 12 times, 0.0 once: a run of 0.1s is expected, a run of 0.0s is telling
    plan = plan_levels_history("sara", 8, {"10": 12.0, "0": 1.0}, 2, 1.0, 0.5)
    own = {label: thr for label, thr, _ in plan.by_level}
    assert own["10"] < own["0"]
    assert plan.initial_issue == min(own.values())
    # no counts: the run's one plan
    assert plan_levels_history("sara", 8, {}, 2, 1.0, 0.5) == plan_levels("sara", 8, 2, 1.0, 0.5)


@pytest.mark.parametrize("index", range(len(HISTORY_CASES)))
async def test_lua_matches_the_per_prompt_reference(store, index):
    k, levels, alpha0, tau, counts, stream = HISTORY_CASES[index]
    want = reference_history(k, levels, alpha0, tau, counts, stream)
    gid = f"h{index}"
    assert await store.groups.open_groups(0.0, 10**9, [(gid, "p", want["plan"])], "complete") == 1
    assert int((await _group(store, gid))[GroupField.issued]) == want["plan"].initial_issue
    for n, (level, decision, issued, p) in enumerate(want["steps"]):
        result = RolloutResult(rollout_id=f"{gid}:{n}", reward=float(n % 2))
        applied = await apply_results(store, 1.0, "w", [result], [n % 2], 1.0, alpha0,
                                                   alpha0, 60.0, levels=[level],
                                                   levels_in_use=levels)
        assert applied.decisions == [(gid, decision)], f"after levels {stream[:n + 1]}"
        row = await _group(store, gid)
        assert int(row[GroupField.issued]) == issued
        if p is not None:     # the stored p_eff is the run's own table entry, to the bit
            assert float(row[GroupField.p_eff]) == p
