"""The reward view's cost-aware threshold (autotau.level_thresholds): with two levels under a
symmetric prior it is the binary rule; on a pool known exactly it finds the fixed threshold
with the fewest rollouts per effective group, by enumeration; its rows and plan are what the
scheduler and the Lua read."""

from __future__ import annotations

import itertools
import math

import pytest
from sara_service.math.autotau import (GRID, PoolModel, auto_thresholds, fixed_point_rho,
                                       level_cost_and_yield, level_evidence, level_pool_prior,
                                       level_thresholds)
from sara_service.math.reward_levels import level_table, plan_levels_auto


@pytest.mark.parametrize("alpha0", [0.3, 1.0, 2.0])
@pytest.mark.parametrize("k", [4, 8, 16])
def test_two_levels_under_a_symmetric_prior_are_the_binary_rule(alpha0, k):
    model = level_pool_prior(alpha0, 2)          # Beta(alpha0, alpha0): both sides alike
    rho = fixed_point_rho(model, k, levels=2)
    assert rho == pytest.approx(fixed_point_rho(model, k), rel=1e-12)
    for price in (rho, 2.0, 50.0):
        binary = auto_thresholds(model, k, price, allow_skip=False)
        levels = level_thresholds(model, k, price, 2)
        assert levels.after_failures == levels.after_successes == binary.after_successes
        assert levels.p_eff_fail[1:] == pytest.approx(binary.p_eff_success[1:], abs=1e-12)


def _pool_on_grid() -> list[tuple[int, ...]]:
    """Prompts with three levels each, every chance a multiple of 1/32 (a GRID point)."""
    return [(32, 0, 0), (30, 1, 1), (24, 4, 4), (16, 8, 8), (12, 10, 10), (28, 4, 0),
            (20, 12, 0), (31, 1, 0)]


def _pairs_model(pool: list[tuple[int, ...]]) -> PoolModel:
    weights = [0.0] * len(GRID)
    for prompt in pool:
        for units in prompt:
            weights[units] += 1.0
    total = sum(weights)
    return PoolModel(tuple(w / total for w in weights))


def _enumerated_ratio(pool: list[tuple[int, ...]], k: int, t: int) -> float:
    """Rollouts per effective group of "abandon after t equal levels, fill a mixed group to k",
    by enumerating each prompt's level sequences of length min(t, k)."""
    cost = mixed = 0.0
    n = min(t, k)
    for prompt in pool:
        chances = [u / 32 for u in prompt]
        for seq in itertools.product(range(3), repeat=n):
            p = math.prod(chances[x] for x in seq)
            if len(set(seq)) > 1:
                cost, mixed = cost + p * k, mixed + p
            elif t <= k:
                cost += p * t
            else:                        # never abandoned: complete, and pure
                cost += p * k
    return cost / mixed if mixed else math.inf     # t = 1: nothing is ever mixed


@pytest.mark.parametrize("k", [4, 6])
def test_on_a_known_pool_the_fixed_point_threshold_is_the_cheapest_fixed_threshold(k):
    pool = _pool_on_grid()
    model = _pairs_model(pool)
    ratios = {t: _enumerated_ratio(pool, k, t) for t in range(1, k + 2)}
    for t, ratio in ratios.items():      # the per-level figures are exact, up to the factor L
        cost, mixed = level_cost_and_yield(model, k, t)
        if ratio == math.inf:
            assert mixed == 0.0
            continue
        assert cost / mixed == pytest.approx(ratio, rel=1e-12)
    rho = fixed_point_rho(model, k, levels=3)
    chosen = level_thresholds(model, k, rho, 3).after_failures
    assert ratios[chosen] == pytest.approx(min(ratios.values()), rel=1e-12)
    assert rho == pytest.approx(min(ratios.values()), rel=1e-12)
    assert chosen <= k                   # this pool has prompts not worth a whole group


def test_the_prior_model_gives_the_dirichlets_start_chance_and_tables():
    model = level_pool_prior(1.0, 3)
    got = level_thresholds(model, 8, 10.0, 3)
    exact = level_table(8, 3, 1.0)
    # the discretised Beta is close to the Dirichlet's exact table, not equal to it
    assert got.p_eff_fail == pytest.approx(exact, abs=0.01)
    assert got.p_eff_fail[0] == pytest.approx(1 - 3 * math.exp(
        math.log(sum(w * g**8 for w, g in zip(model.weights, GRID)))), abs=1e-12)


def test_level_evidence_gives_one_row_per_level_in_use():
    assert level_evidence([3.0, 1.0], 3) == [(3.0, 1.0), (1.0, 3.0), (0.0, 4.0)]
    assert level_evidence([2.5], 2) == [(2.5, 0.0), (0.0, 2.5)]


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="at least 2 levels"):
        level_pool_prior(1.0, 1)
    with pytest.raises(ValueError, match="rho must be finite"):
        level_thresholds(level_pool_prior(1.0, 2), 8, 0.0, 2)
    with pytest.raises(ValueError, match="PoolModel"):
        plan_levels_auto(8, 2, "not a model", 10.0)


def test_the_plan_is_the_thresholds_on_both_sides_with_the_table_up_to_it():
    model = _pairs_model(_pool_on_grid())
    rho = fixed_point_rho(model, 6, levels=3)
    plan = plan_levels_auto(6, 3, model, rho)
    auto = level_thresholds(model, 6, rho, 3)
    assert plan.after_failures == plan.after_successes == auto.after_failures
    assert plan.initial_issue == min(auto.after_failures, 6)
    assert plan.p_eff_fail == plan.p_eff_success == auto.p_eff_fail[: plan.initial_issue + 1]
    assert not plan.skip and not plan.deliver_saturated and plan.policy == "sara"
    # a floor above every p_eff allows nothing to stop: the group is never abandoned
    never = plan_levels_auto(6, 3, model, rho, floor=1e-9)
    assert never.after_failures == 7
