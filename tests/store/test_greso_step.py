"""greso_step.lua against the Python rule (selection.greso_adapt) over a random run: the same
rates, stepped once per policy version, from the same group-end counters."""

from __future__ import annotations

import random

import pytest

from sara_service.math.selection import GresoParams, greso_adapt

ENDED = ("groups_ended_all_fail", "groups_ended_all_success", "groups_ended_mixed")


def mirror(events, params):
    """(p_easy, p_hard) after each (version, adapt, ended) event, written out by hand."""
    out, state = [], None
    for version, adapt, ended in events:
        fail, success, mixed = ended
        total = fail + success + mixed
        if state is None:
            state = dict(v=version, pe=params.p_start, ph=params.p_start, counts=(fail, success,
                                                                                  total))
        elif version > state["v"]:
            f0, s0, n0 = state["counts"]
            if adapt and total > n0:
                state["pe"] = greso_adapt(state["pe"], (success - s0) / (total - n0),
                                          params.target_easy, params)
                state["ph"] = greso_adapt(state["ph"], (fail - f0) / (total - n0),
                                          params.target_hard, params)
            state.update(v=version, counts=(fail, success, total))
        out.append((state["pe"], state["ph"]))
    return out


@pytest.mark.anyio
@pytest.mark.parametrize("seed", range(3))
async def test_lua_steps_the_rates_as_python_does(store, seed):
    rng, params = random.Random(seed), GresoParams(step=0.07, p_min=0.1, p_max=0.9)
    events, version, ended = [], 0, [0, 0, 0]
    for _ in range(120):
        version += rng.choice((0, 0, 1, 3))
        for i in range(3):
            ended[i] += rng.choice((0, 0, 1, 2, 5)) if i < 2 else rng.randint(0, 6)
        events.append((version, rng.random() < 0.8, tuple(ended)))
    got = []
    for version, adapt, counts in events:
        await store.redis.hset(store.keys.stats, mapping=dict(zip(ENDED, counts)))
        got.append(await store.policy.greso_rates(version, adapt, params))
    assert got == mirror(events, params)           # exact: the same doubles
    assert len({g for g in got}) > 5              # the rates moved, both ways
    assert all(params.p_min <= p <= params.p_max for pair in got for p in pair)


@pytest.mark.anyio
async def test_a_first_call_starts_both_rates_and_an_older_version_changes_nothing(store):
    params = GresoParams()
    assert await store.policy.greso_rates(4, True, params) == (0.5, 0.5)
    await store.redis.hset(store.keys.stats, mapping={ENDED[1]: 10})
    assert await store.policy.greso_rates(3, True, params) == (0.5, 0.5)   # no step backwards
    assert await store.policy.greso_rates(5, True, params) == (0.49, 0.51)  # all easy: skip more easy
