"""The cost-aware thresholds (tau_low = "auto"): the DP against brute force, its limits, the
fixed-point price, the pool fit, and plan_group's "auto" plans."""

from __future__ import annotations

import itertools
import math

import pytest
from sara_service.math.allocation import plan_group
from sara_service.math.autotau import (
    GRID, PoolModel, TokenLengths, auto_thresholds, expected_cost_and_yield, fit_pool,
    fixed_point_rho,
)

# 30% never solved, 25% always, the rest spread: the shape of the benchmark's standard pool
POINTS = PoolModel(tuple(0.30 if g == 0 else 0.25 if g == 1 else 0.45 / 31 for g in GRID))
MODELS = [PoolModel.beta(1, 1), PoolModel.beta(0.3, 0.6), POINTS]


def _play(seq: tuple[int, ...], k: int, t_f: int, t_s: int) -> tuple[int, bool]:
    """(rollouts spent, ended mixed) of one outcome sequence under the threshold rule
    ("complete": a mixed group is filled to k)."""
    for n in range(1, k + 1):
        s = sum(seq[:n])
        if 0 < s < n:
            return k, True
        if (s == 0 and n >= t_f) or (s == n and n >= t_s):
            return n, False
    return k, False


def _enumerate(model: PoolModel, k: int, t_f: int, t_s: int,
               lengths: TokenLengths | None = None) -> tuple[float, float]:
    """(E[cost], P(mixed)) by playing every outcome sequence through the threshold rule; with
    `lengths`, the cost in tokens (each rollout its outcome's length)."""
    cost = mixed = 0.0
    for seq in itertools.product((0, 1), repeat=k):
        p = sum(w * math.prod(g if x else 1 - g for x in seq) for w, g in zip(model.weights, GRID))
        spent, ended_mixed = _play(seq, k, t_f, t_s)
        if lengths is None:
            cost += p * spent
        else:
            cost += p * sum(lengths.success if x else lengths.failure for x in seq[:spent])
        mixed += p * ended_mixed
    return cost, mixed


def _best_pair(model: PoolModel, k: int, rho: float) -> float:
    """max over every pair of thresholds (1..k+1 each) of rho * P(mixed) - E[cost]."""
    return max(rho * m - c for c, m in (
        _enumerate(model, k, t_f, t_s) for t_f in range(1, k + 2) for t_s in range(1, k + 2)))


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("k", [3, 5])
@pytest.mark.parametrize("rho", [2.0, 6.0, 9.0, 15.0, 40.0])
def test_the_dp_thresholds_are_the_best_of_all_threshold_pairs(model, k, rho):
    plan = auto_thresholds(model, k, rho, allow_skip=False)
    cost, mixed = _enumerate(model, k, plan.after_failures, plan.after_successes)
    assert rho * mixed - cost == pytest.approx(_best_pair(model, k, rho), abs=1e-9)
    assert plan.start_value == pytest.approx(rho * mixed - cost, abs=1e-9)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("t_f,t_s", [(1, 1), (2, 5), (6, 3), (6, 6)])
def test_expected_cost_and_yield_match_enumeration(model, t_f, t_s):
    got = expected_cost_and_yield(model, 5, t_f, t_s)
    assert got == pytest.approx(_enumerate(model, 5, t_f, t_s), abs=1e-12)


@pytest.mark.parametrize("model", MODELS)
def test_a_tiny_price_skips_and_a_huge_one_never_abandons(model):
    assert (auto_thresholds(model, 16, 0.5).after_failures,
            auto_thresholds(model, 16, 0.5).after_successes) == (0, 0)
    never = auto_thresholds(model, 16, 1e6)
    assert (never.after_failures, never.after_successes) == (17, 17)


@pytest.mark.parametrize("model", MODELS)
def test_thresholds_grow_with_the_price(model):
    last = (1, 1)
    for rho in [1.5 ** i for i in range(2, 20)]:
        plan = auto_thresholds(model, 16, rho, allow_skip=False)
        now = (plan.after_failures, plan.after_successes)
        assert now[0] >= last[0] and now[1] >= last[1], (rho, last, now)
        last = now


def test_a_fresh_prompt_is_never_skipped_unless_allowed():
    plan = auto_thresholds(POINTS, 8, 0.5, allow_skip=False)
    assert (plan.after_failures, plan.after_successes) != (0, 0)


@pytest.mark.parametrize("floor", [0.05, 0.2, 0.5])
def test_the_floor_bounds_p_eff_wherever_a_group_is_abandoned(floor):
    for rho in (3.0, 10.0, 25.0):
        plan = auto_thresholds(POINTS, 16, rho, floor=floor)
        for n, table in ((plan.after_failures, plan.p_eff_fail),
                         (plan.after_successes, plan.p_eff_success)):
            if n <= 16:  # 0 (a skip) reads p_eff before any rollout, entry 0
                assert table[n] < floor


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("k", [4, 8])
def test_the_fixed_point_price_is_the_best_ratio_of_any_thresholds(model, k):
    rho = fixed_point_rho(model, k)
    best = min(c / m for c, m in (expected_cost_and_yield(model, k, t_f, t_s)
                                  for t_f in range(1, k + 2) for t_s in range(1, k + 2)) if m > 0)
    assert rho == pytest.approx(best, rel=1e-9)


def test_the_pool_fit_finds_never_and_always_solved_prompts():
    evidence = [(0.0, 6.0)] * 30 + [(6.0, 0.0)] * 25 + [(3.0, 3.0)] * 45
    model = fit_pool(evidence, PoolModel.beta(1, 1), prior_weight=1.0, iterations=200)
    assert model.weights[0] > 0.15 and model.weights[-1] > 0.12
    assert model.mean() == pytest.approx(0.475, abs=0.03)
    assert fit_pool([], PoolModel.beta(1, 1)) == PoolModel.beta(1, 1)


def test_evidence_reweights_the_pool():
    after_failures = POINTS.given(0.0, 4.0)
    assert after_failures.weights[-1] == 0.0 and after_failures.weights[0] > POINTS.weights[0]


def test_plan_group_auto_gives_a_lua_ready_plan():
    plan = plan_group("sara", 16, 1.0, 1.0, "auto", rho=24.0, pool=POINTS)
    t_f, t_s = plan.after_failures, plan.after_successes
    assert 1 < t_f <= 4 and 1 < t_s <= 4       # this pool pays to abandon early
    assert plan.initial_issue == min(t_f, t_s)
    assert (len(plan.p_eff_fail), len(plan.p_eff_success)) == (t_f + 1, t_s + 1)
    ds = plan_group("dynamic_sampling", 16, 1.0, 1.0, "auto")
    assert (ds.after_failures, ds.after_successes) == (17, 17)
    # no price: the model's own fixed point; a Beta(1, 1) pool never pays to abandon at k = 16
    assert plan_group("sara", 16, 1.0, 1.0, "auto").after_failures == 17


def test_bad_prices_are_refused():
    with pytest.raises(ValueError):
        auto_thresholds(POINTS, 8, 0.0)
    with pytest.raises(ValueError):
        plan_group("sara", 8, 1.0, 1.0, "auto", rho=-1.0)


# --- priced in tokens (SARA_AUTO_PRICE=tokens)

# the sim backend's mean lengths at max_tokens 256 (bench/_pools.Lengths.of_sim), rounded
SIM_LENGTHS = TokenLengths(success=58.0, failure=127.0)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("length", [128.0, 100.0])
@pytest.mark.parametrize("k", [5, 8, 16])
def test_equal_lengths_give_the_rollout_plan_at_the_scaled_price(model, length, k):
    same = TokenLengths(length, length)
    for rho in (3.0, 9.0, 20.0):
        rollouts = auto_thresholds(model, k, rho, allow_skip=False)
        tokens = auto_thresholds(model, k, rho * length, allow_skip=False, lengths=same)
        assert (tokens.after_failures, tokens.after_successes) == (
            rollouts.after_failures, rollouts.after_successes)
        assert tokens.start_value == pytest.approx(length * rollouts.start_value, abs=1e-6)
    assert fixed_point_rho(model, k, lengths=same) == pytest.approx(
        length * fixed_point_rho(model, k), rel=1e-9)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("rho", [300.0, 900.0, 2500.0])
def test_the_token_dp_is_the_best_of_all_threshold_pairs_in_tokens(model, rho):
    k = 5
    plan = auto_thresholds(model, k, rho, allow_skip=False, lengths=SIM_LENGTHS)
    value = [rho * m - c for c, m in (_enumerate(model, k, t_f, t_s, SIM_LENGTHS)
                                      for t_f in range(1, k + 2) for t_s in range(1, k + 2))]
    cost, mixed = _enumerate(model, k, plan.after_failures, plan.after_successes,
                                    SIM_LENGTHS)
    assert rho * mixed - cost == pytest.approx(max(value), abs=1e-6)
    assert plan.start_value == pytest.approx(rho * mixed - cost, abs=1e-6)
    closed = expected_cost_and_yield(model, k, plan.after_failures, plan.after_successes,
                                     lengths=SIM_LENGTHS)
    assert closed == pytest.approx((cost, mixed), abs=1e-9)


@pytest.mark.parametrize("k", [8, 16])
def test_longer_failures_abandon_runs_of_failures_earlier(k):
    # each rule at its own fixed point: the rollout price stops after 3 failures on this pool;
    # failures twice as long as successes make the third one too dear
    rollouts = auto_thresholds(POINTS, k, fixed_point_rho(POINTS, k), allow_skip=False)
    rho = fixed_point_rho(POINTS, k, lengths=SIM_LENGTHS)
    tokens = auto_thresholds(POINTS, k, rho, allow_skip=False, lengths=SIM_LENGTHS)
    assert tokens.after_failures < rollouts.after_failures
    assert tokens.after_successes >= rollouts.after_successes   # cheap runs go on longer
    # and the token plan spends fewer tokens per effective group (closed form)
    spent = [expected_cost_and_yield(POINTS, k, p.after_failures, p.after_successes,
                                     lengths=SIM_LENGTHS) for p in (tokens, rollouts)]
    assert spent[0][0] / spent[0][1] < 0.97 * spent[1][0] / spent[1][1]


def test_plan_group_prices_in_tokens_and_refuses_bad_lengths():
    plan = plan_group("sara", 8, 1.0, 1.0, "auto", pool=POINTS, lengths=SIM_LENGTHS)
    assert plan.after_failures == 2       # at the token fixed point (see the test above)
    with pytest.raises(ValueError):
        plan_group("sara", 8, 1.0, 1.0, "auto", pool=POINTS, lengths=(58.0, 127.0))
    with pytest.raises(ValueError):
        TokenLengths(0.0, 10.0)
