"""The reward view's Dirichlet math, against mpmath at 50 digits, and against the outcome view's
Beta-binomial where the two coincide (two levels)."""

from __future__ import annotations

import random

import mpmath
import pytest

from sara_service.math.allocation import p_eff, plan_group
from sara_service.math.reward_levels import (
    decide_levels, first_non_binary, level_of, level_table, levels_in_use, mixed_chance_levels,
    p_eff_levels, plan_levels,
)

mpmath.mp.dps = 50


def reference(counts: list[int], k: int, alphas: list[float]) -> mpmath.mpf:
    """p_eff in 50-digit arithmetic, straight from the product formula."""
    a = [mpmath.mpf(x) for x in alphas]
    total = mpmath.fsum(a)
    n = sum(counts)
    present = [j for j, c in enumerate(counts) if c > 0]
    if len(present) >= 2:
        return mpmath.mpf(1)

    def stay(j: int) -> mpmath.mpf:
        return mpmath.fprod((a[j] + i) / (total + i) for i in range(n, k))

    if n == 0:
        return 1 - mpmath.fsum(stay(j) for j in range(len(a)))
    return 1 - stay(present[0])


def random_case(rng: random.Random) -> tuple[list[int], int, list[float]]:
    levels = rng.randint(2, 6)
    k = rng.choice([2, 3, 4, 8, 16, 64, 256, 1024])
    alphas = [10 ** rng.uniform(-2, 6) for _ in range(levels)]
    n = rng.randint(0, k)
    counts = [0] * levels
    kind = rng.random()
    if kind < 0.7 and n:            # all at one level: the prefixes SARA decides
        counts[rng.randrange(levels)] = n
    elif n >= 2:                    # mixed
        first, second = rng.sample(range(levels), 2)
        counts[first], counts[second] = n - 1, 1
    return counts, k, alphas


@pytest.mark.parametrize("seed", range(400))
def test_p_eff_is_exact_against_high_precision(seed):
    counts, k, alphas = random_case(random.Random(seed))
    got = p_eff_levels(counts, k, alphas)
    want = reference(counts, k, alphas)
    # absolute 1e-13: p_eff is a probability, and 1 - P loses P's relative precision near 1
    assert abs(mpmath.mpf(got) - want) <= mpmath.mpf("1e-13") * max(1, abs(want)), (
        counts, k, alphas, got, want)


@pytest.mark.parametrize("seed", range(200))
def test_stay_probability_keeps_its_relative_precision(seed):
    """1 - p_eff, the chance the group stays at one level, is right to ~1e-12 relative even
    when tiny: that is what thresholds compare with tau_low near 1."""
    rng = random.Random(1000 + seed)
    levels, k = rng.randint(2, 5), rng.choice([4, 8, 16, 64])
    alphas = [10 ** rng.uniform(-1, 3) for _ in range(levels)]
    counts = [0] * levels
    counts[0] = rng.randint(1, k)
    want = 1 - reference(counts, k, alphas)
    got = 1 - mpmath.mpf(p_eff_levels(counts, k, alphas))
    if want > mpmath.mpf("1e-3"):
        assert abs(got - want) <= mpmath.mpf("1e-12") * want


def test_the_worked_example():
    """Dirichlet(1, 1, 1), k = 8: after 2 results at one level the rest stay with chance
    prod_{i=2}^{7} (1 + i) / (3 + i) = (3 * 4) / (9 * 10)."""
    assert p_eff_levels([2, 0, 0], 8, [1.0, 1.0, 1.0]) == pytest.approx(1 - 12 / 90, abs=1e-15)
    assert p_eff_levels([1, 1, 0], 8, [1.0, 1.0, 1.0]) == 1.0
    assert p_eff_levels([8, 0, 0], 8, [1.0, 1.0, 1.0]) == 0.0


@pytest.mark.parametrize("seed", range(200))
def test_two_levels_are_the_beta_binomial_to_the_bit(seed):
    """Level 0 = failure with beta0, level 1 = success with alpha0: the outcome view's p_eff."""
    rng = random.Random(seed)
    k = rng.choice([2, 8, 16, 100, 1024])
    a, b = 10 ** rng.uniform(-2, 6), 10 ** rng.uniform(-2, 6)
    n = rng.randint(0, k)
    s = rng.choice([0, n, rng.randint(0, n)])
    assert p_eff_levels([n - s, s], k, [b, a]) == p_eff(n, s, k, a, b)


@pytest.mark.parametrize("k,alpha0,tau", [(8, 1.0, 0.5), (16, 0.5, 0.3), (4, 2.0, 0.9)])
def test_two_level_plan_is_the_outcome_plan_under_a_symmetric_prior(k, alpha0, tau):
    for policy in ("sara", "dynamic_sampling", "uniform"):
        assert plan_levels(policy, k, 2, alpha0, tau) == plan_group(policy, k, alpha0, alpha0,
                                                                      tau)


def test_more_levels_abandon_later():
    """k = 8, Dirichlet(1, ...): two levels abandon after 4 equal rewards, three after 6."""
    assert plan_levels("sara", 8, 2, 1.0, 0.5).after_failures == 4
    three = plan_levels("sara", 8, 3, 1.0, 0.5)
    assert (three.after_failures, three.after_successes, three.initial_issue) == (6, 6, 6)
    assert level_table(8, 3, 1.0)[6] == pytest.approx(1 - 7 * 8 / 90)


@pytest.mark.parametrize("seed", range(100))
def test_decide_levels_agrees_with_the_plan_thresholds(seed):
    rng = random.Random(seed)
    k, levels = rng.choice([4, 8, 16]), rng.randint(2, 5)
    alpha0, tau = 10 ** rng.uniform(-1, 1), rng.uniform(0.05, 0.95)
    plan = plan_levels("sara", k, levels, alpha0, tau)
    for n in range(1, k + 1):
        decision = decide_levels([7] * n, k, levels, alpha0, tau)
        assert (decision == "abandon") == (n >= plan.after_failures), (n, plan)
    assert decide_levels([0, 0, 3], k, levels, alpha0, tau) == "commit"


def test_levels_are_the_tolerance_grid():
    assert [level_of(r, 0.1) for r in (0.0, 0.04, 0.05, 0.1, 1.0, -0.1)] == [0, 0, 1, 1, 10, -1]
    assert level_of(0.1, 1e-6) == 100000 and level_of(1.0, 1e-6) == 1000000
    assert level_of(0.1000000001, 1e-6) == level_of(0.1, 1e-6)
    with pytest.raises(ValueError, match="finite"):
        level_of(float("nan"), 0.1)
    with pytest.raises(ValueError, match="tolerance"):
        level_of(1.0, 0.0)


def test_levels_in_use_and_the_binary_check():
    assert levels_in_use(2, 0) == 2 and levels_in_use(2, 3) == 3 and levels_in_use(4, 3) == 4
    assert first_non_binary([0.0, 1.0, 1.0]) is None
    assert first_non_binary([1.0, 0.1, 0.5]) == 0.1


def test_mixed_chance_under_the_prompt_posterior():
    """Three levels, alpha0 = 1, the prompt has 4 rollouts at "0" and 1 at "5": abandoned pure
    at "0" with 3 missing, it would have stayed with chance (5/8)(6/9)(7/10)."""
    q = mixed_chance_levels({"0": 4.0, "5": 1.0}, "0", 3, 3, 1.0)
    assert q == pytest.approx(1 - (5 / 8) * (6 / 9) * (7 / 10))


def test_bad_input_says_what_is_wrong():
    with pytest.raises(ValueError, match="one entry per level"):
        p_eff_levels([1, 0], 8, [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="more than k"):
        p_eff_levels([5, 4], 8, [1.0, 1.0])
    with pytest.raises(ValueError, match="Dirichlet"):
        p_eff_levels([1, 0], 8, [1.0, 0.0])
