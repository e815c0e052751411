"""sara_service.math.allocation: p_eff, thresholds, decide, plans, posterior decay."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import gammaln
from scipy.stats import betabinom

from sara_service.math.allocation import (
    GroupPlan,
    Thresholds,
    abandon_thresholds,
    decay_posterior,
    decay_weight,
    decide,
    issue_target,
    p_eff,
    plan_group,
)

try:
    from tests.allocation_cases import generate_cases
except ImportError:  # tests/ itself on sys.path, or neither: load the file directly
    try:
        from allocation_cases import generate_cases  # type: ignore[no-redef]
    except ImportError:
        _spec = importlib.util.spec_from_file_location(
            "allocation_cases", Path(__file__).resolve().parents[1] / "allocation_cases.py"
        )
        _module = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
        _spec.loader.exec_module(_module)  # type: ignore[union-attr]
        generate_cases = _module.generate_cases

EPS = float(np.finfo(float).eps)
POLICIES = ["uniform", "dynamic_sampling", "sara"]

# Hypothesis strategies: priors log-uniform over [1e-2, 1e6], as in the brief.
log_params = st.floats(min_value=-2.0, max_value=6.0).map(lambda e: 10.0**e)
taus = st.one_of(st.sampled_from([0.0, 1.0, 0.5]), st.floats(min_value=0.0, max_value=1.0))


def _random_prefixes(seed: int, count: int):
    """(n, s, k, alpha0, beta0) with k in 1..1024, priors log-uniform in [1e-2, 1e6]."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        k = int(rng.integers(1, 1025))
        alpha0, beta0 = 10 ** rng.uniform(-2, 6, size=2)
        kind = i % 4  # empty, all-fail, all-success and mixed prefixes in equal shares
        n = 0 if kind == 0 else int(rng.integers(1, k + 1))
        s = {0: 0, 1: 0, 2: n}.get(kind, int(rng.integers(1, n)) if n >= 2 else n)
        yield n, s, k, float(alpha0), float(beta0)


def _lgamma_scale(*pairs: tuple[float, float]) -> float:
    return sum(abs(gammaln(a)) + abs(gammaln(b)) + abs(gammaln(a + b)) for a, b in pairs)


def _scipy_p_eff(n: int, s: int, k: int, a: float, b: float) -> tuple[float, float]:
    """p_eff from scipy's beta-binomial, and the absolute error scipy itself carries.

    scipy's betabinom.logpmf is a sum of betaln values, and for large arguments betaln is a
    difference of lgamma values (~1e7 at 1e6), so the log it returns is off by about
    eps * sum|lgamma| in absolute terms; 1 - pmf inherits that as an *absolute* error (up to
    ~1e-8 at the top of the range, against 1e-15 for O(1) priors). We allow 4x that and no more:
    where scipy is accurate the 1e-9 relative tolerance is what binds.
    """
    if 0 < s < n:
        return 1.0, 0.0
    if n == 0:
        dist = betabinom(k, a, b)
        value = -math.expm1(dist.logpmf(0)) - math.exp(dist.logpmf(k))
        scale = _lgamma_scale((a, b), (a, b + k), (a + k, b))
    elif n == k:
        return 0.0, 0.0  # nothing left to draw: a pure complete group is never mixed
    elif s == 0:  # remaining k-n draws under the posterior Beta(a, b+n) must all fail
        value = -math.expm1(betabinom(k - n, a, b + n).logpmf(0))
        scale = _lgamma_scale((a, b + n), (a, b + k))
    else:  # remaining k-n draws under Beta(a+n, b) must all succeed
        value = -math.expm1(betabinom(k - n, a + n, b).logpmf(k - n))
        scale = _lgamma_scale((a + n, b), (a + k, b))
    return value, 4 * EPS * (scale + 1.0)


# ----------------------------------------------------------------------------------- p_eff


def test_p_eff_matches_scipy_betabinom_on_random_cases():
    for n, s, k, a, b in _random_prefixes(seed=1234, count=240):
        expected, atol = _scipy_p_eff(n, s, k, a, b)
        got = p_eff(n, s, k, a, b)
        assert 0.0 <= got <= 1.0
        assert got == pytest.approx(expected, rel=1e-9, abs=atol), (n, s, k, a, b)


def test_p_eff_matches_high_precision_beta_functions():
    # scipy cannot check the last digits at alpha, beta ~ 1e6; 60-digit mpmath can, with no
    # absolute slack at all.
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 60
    beta = mpmath.beta
    for n, s, k, a, b in _random_prefixes(seed=99, count=60):
        A, B = mpmath.mpf(a), mpmath.mpf(b)
        if 0 < s < n:
            expected = mpmath.mpf(1)
        elif n == 0:
            expected = 1 - beta(A, B + k) / beta(A, B) - beta(A + k, B) / beta(A, B)
        elif s == 0:
            expected = 1 - beta(A, B + k) / beta(A, B + n)
        else:
            expected = 1 - beta(A + k, B) / beta(A + n, B)
        assert p_eff(n, s, k, a, b) == pytest.approx(float(expected), rel=1e-11, abs=0.0)


@pytest.mark.parametrize("k", [1, 2, 3, 8, 100, 1024])
def test_p_eff_uniform_prior_closed_form(k):
    # Beta(1, 1): after n failures the rest all fail with probability (n+1)/(k+1).
    assert p_eff(0, 0, k, 1.0, 1.0) == pytest.approx((k - 1) / (k + 1), rel=1e-12, abs=1e-15)
    for n in range(1, k + 1):
        expected = (k - n) / (k + 1)
        assert p_eff(n, 0, k, 1.0, 1.0) == pytest.approx(expected, rel=1e-12, abs=0.0)
        assert p_eff(n, n, k, 1.0, 1.0) == pytest.approx(expected, rel=1e-12, abs=0.0)


def test_p_eff_special_values():
    assert p_eff(5, 2, 8, 3.0, 7.0) == 1.0  # mixed prefix
    assert p_eff(8, 0, 8, 3.0, 7.0) == 0.0  # complete all-fail group
    assert p_eff(8, 8, 8, 3.0, 7.0) == 0.0
    assert math.copysign(1.0, p_eff(8, 0, 8, 3.0, 7.0)) == 1.0  # +0.0, not -0.0
    assert p_eff(0, 0, 1, 2.0, 3.0) == 0.0  # one rollout can never be mixed


def test_p_eff_stable_at_extreme_priors():
    # Where differences of lgamma(~1e6) would keep only ~6 digits, these must keep ~15.
    assert p_eff(1, 0, 1024, 1e6, 1e6) == 1.0  # gamma pinned at 0.5: 1023 failures in a row?
    tiny = p_eff(1, 0, 2, 1e-2, 1e6)  # gamma ~ 1e-8: the one remaining draw almost surely fails
    assert tiny == pytest.approx(1e-2 / (1e-2 + 1e6 + 1), rel=1e-13)


@pytest.mark.parametrize(
    "a, b, k", [(1e6, 1e-2, 16), (1e-2, 1e6, 16), (1e6, 1e6, 1024), (0.5, 3.0, 7)]
)
def test_log_probability_of_staying_pure_is_accurate(a, b, k):
    # The building block: log B(a, b+k)/B(a, b+n). At a >> b a one-step failure probability
    # is ~1e-8, where log1p(-a/(a+b)) would keep only ~8 digits; every entry must keep ~13.
    from sara_service.math.allocation import log_stay_pure

    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 60
    logs = log_stay_pure(a, b, k)
    A, B = mpmath.mpf(a), mpmath.mpf(b)
    for n in range(k):
        expected = mpmath.log(mpmath.beta(A, B + k) / mpmath.beta(A, B + n))
        assert logs[n] == pytest.approx(float(expected), rel=1e-12, abs=0.0)
    assert logs[k] == 0.0


@settings(max_examples=100, deadline=None)
@given(a=log_params, b=log_params)
def test_p_eff_two_rollouts_closed_form(a, b):
    # k = 2 from scratch: mixed with probability 2 E[gamma (1 - gamma)] = 2ab / ((a+b)(a+b+1)).
    expected = 2 * a * b / ((a + b) * (a + b + 1))
    # 1 - P(both fail) - P(both succeed) cancels: absolute error ~ eps, relative ~ eps/expected.
    assert p_eff(0, 0, 2, a, b) == pytest.approx(expected, rel=1e-9, abs=8 * EPS)


# ------------------------------------------------------------------------------ monotonicity


@settings(max_examples=60, deadline=None)
@given(k=st.integers(1, 1024), a=log_params, b=log_params)
def test_p_eff_non_increasing_along_pure_prefixes(k, a, b):
    plan = plan_group("uniform", k, a, b, 0.5)  # uniform plans tabulate p_eff for n = 0..k
    for table in (plan.p_eff_fail, plan.p_eff_success):
        assert len(table) == k + 1
        assert all(table[n + 1] <= table[n] for n in range(1, k))
        assert table[k] == 0.0


@settings(max_examples=30, deadline=None)
@given(k=st.integers(1, 64), a=log_params, b=log_params)
def test_plan_tables_are_exactly_p_eff(k, a, b):
    plan = plan_group("dynamic_sampling", k, a, b, 0.5)
    assert plan.p_eff_fail == tuple(p_eff(n, 0, k, a, b) for n in range(k + 1))
    assert plan.p_eff_success == tuple(p_eff(n, n, k, a, b) for n in range(k + 1))


# --------------------------------------------------------------------- thresholds and decide


@settings(max_examples=150, deadline=None)
@given(k=st.integers(1, 96), a=log_params, b=log_params, tau=taus)
def test_thresholds_agree_with_decide_and_p_eff(k, a, b, tau):
    limits = abandon_thresholds(k, a, b, tau)
    start = p_eff(0, 0, k, a, b)
    if limits == Thresholds(0, 0):
        assert start < tau
        assert decide(0, 0, k, a, b, tau) == "abandon"
        return
    assert start >= tau and decide(0, 0, k, a, b, tau) == "continue"
    for limit, all_success in ((limits.after_failures, False), (limits.after_successes, True)):
        assert 1 <= limit <= k + 1
        for n in range(1, k + 1):
            s = n if all_success else 0
            expected = "continue" if n < limit else "abandon"
            assert decide(n, s, k, a, b, tau) == expected, (n, limit)
            assert (p_eff(n, s, k, a, b) < tau) == (n >= limit)
    if tau > 0:  # p_eff(k) = 0 < tau, so a threshold always exists
        assert max(limits.after_failures, limits.after_successes) <= k
    else:
        assert limits == Thresholds(k + 1, k + 1)


def test_thresholds_known_values():
    # Beta(1, 1), k = 8: p_eff(n) = (8 - n)/9 drops below 0.5 at n = 4; p_eff(0) = 7/9.
    assert abandon_thresholds(8, 1.0, 1.0, 0.5) == Thresholds(4, 4)
    assert abandon_thresholds(8, 1.0, 1.0, 0.0) == Thresholds(9, 9)
    assert abandon_thresholds(8, 1.0, 1.0, 1.0) == Thresholds(0, 0)  # p_eff(0) < 1: skip
    # A success-heavy prior abandons sooner on successes than on failures.
    limits = abandon_thresholds(8, 5.0, 0.5, 0.3)
    assert limits.after_successes < limits.after_failures


def test_decide_commits_on_any_mixed_prefix():
    for n in range(2, 9):
        for s in range(1, n):
            assert decide(n, s, 8, 1.0, 1.0, 1.0) == "commit"  # even with tau_low = 1


def test_decide_saturated_complete_group_with_tau_zero_continues():
    assert decide(8, 0, 8, 1.0, 1.0, 0.0) == "continue"
    assert decide(8, 8, 8, 1.0, 1.0, 0.0) == "continue"


# ----------------------------------------------------------------------------- plan_group


def test_plan_group_sara():
    plan = plan_group("sara", 8, 1.0, 1.0, 0.5)
    assert isinstance(plan, GroupPlan)
    assert (plan.after_failures, plan.after_successes, plan.initial_issue) == (4, 4, 4)
    assert not plan.deliver_saturated and not plan.skip
    assert plan.p_eff_fail == pytest.approx([7 / 9, 7 / 9, 6 / 9, 5 / 9, 4 / 9])
    assert plan.p_eff_success == plan.p_eff_fail


def test_plan_group_sara_asymmetric_and_skip():
    plan = plan_group("sara", 8, 5.0, 0.5, 0.3)
    assert plan.initial_issue == min(plan.after_failures, plan.after_successes)
    assert len(plan.p_eff_fail) == min(plan.after_failures, 8) + 1
    assert len(plan.p_eff_success) == min(plan.after_successes, 8) + 1
    skipped = plan_group("sara", 4, 50.0, 0.05, 0.5)
    assert skipped.skip and skipped.initial_issue == 0
    assert len(skipped.p_eff_fail) == len(skipped.p_eff_success) == 1
    assert skipped.p_eff_fail[0] < 0.5


@pytest.mark.parametrize("policy, delivers", [("uniform", True), ("dynamic_sampling", False)])
def test_plan_group_baselines_never_abandon(policy, delivers):
    plan = plan_group(policy, 4, 50.0, 0.05, 0.5)  # a prior SARA would skip
    assert (plan.after_failures, plan.after_successes) == (5, 5)
    assert plan.initial_issue == 4 and not plan.skip
    assert plan.deliver_saturated is delivers
    assert len(plan.p_eff_fail) == len(plan.p_eff_success) == 5
    assert plan.p_eff_fail[4] == plan.p_eff_success[4] == 0.0


def test_plan_group_sara_tau_zero_is_full_group():
    plan = plan_group("sara", 8, 1.0, 1.0, 0.0)
    assert (plan.after_failures, plan.after_successes, plan.initial_issue) == (9, 9, 8)
    assert len(plan.p_eff_fail) == 9 and not plan.deliver_saturated


def test_plan_is_frozen():
    plan = plan_group("sara", 8, 1.0, 1.0, 0.5)
    with pytest.raises(AttributeError):
        plan.k = 4  # type: ignore[misc]


# ---------------------------------------------------------------------------- issue_target


def test_issue_target_follows_the_pure_side():
    plan = plan_group("sara", 16, 20.0, 1.0, 0.2)  # abandons on successes first
    af, asucc = plan.after_failures, plan.after_successes
    assert asucc < af <= 16
    assert issue_target(plan, 0, 0) == asucc == plan.initial_issue
    assert issue_target(plan, 0, 1) == af
    assert issue_target(plan, 3, 0) == asucc
    assert issue_target(plan, 2, 1) == 16  # mixed: committed, filled to k


def test_issue_target_caps_at_k_and_skips():
    never = plan_group("sara", 8, 1.0, 1.0, 0.0)
    assert issue_target(never, 0, 0) == issue_target(never, 0, 5) == issue_target(never, 5, 0) == 8
    assert issue_target(plan_group("uniform", 8, 1.0, 1.0, 0.5), 0, 0) == 8
    assert issue_target(plan_group("sara", 8, 1.0, 1.0, 1.0), 0, 0) == 0


@settings(max_examples=80, deadline=None)
@given(k=st.integers(1, 64), a=log_params, b=log_params, tau=taus, data=st.data())
def test_issue_target_always_covers_the_next_outcome(k, a, b, tau, data):
    # While a pure group is open (not abandoned, not complete), it must have issued at least
    # one rollout beyond those already back, or it would stall.
    plan = plan_group("sara", k, a, b, tau)
    n = data.draw(st.integers(1, k))
    for s, f, limit in ((0, n, plan.after_failures), (n, 0, plan.after_successes)):
        target = issue_target(plan, s, f)
        assert target <= k
        if n < min(limit, k):
            assert target > n


# ------------------------------------------------------------------------- decay_posterior


@settings(max_examples=100, deadline=None)
@given(alpha=log_params, beta=log_params, a0=log_params, b0=log_params, decay=st.floats(0, 1))
def test_decay_zero_versions_is_identity(alpha, beta, a0, b0, decay):
    assert decay_posterior(alpha, beta, a0, b0, decay, 0) == (alpha, beta)


@settings(max_examples=100, deadline=None)
@given(alpha=log_params, beta=log_params, a0=log_params, b0=log_params, dv=st.integers(1, 10**6))
def test_decay_zero_gives_prior(alpha, beta, a0, b0, dv):
    assert decay_posterior(alpha, beta, a0, b0, 0.0, dv) == (a0, b0)


@settings(max_examples=200, deadline=None)
@given(
    alpha=log_params, beta=log_params, a0=log_params, b0=log_params,
    decay=st.floats(0, 1), dv=st.integers(0, 200),
)
def test_decay_stays_between_prior_and_current(alpha, beta, a0, b0, decay, dv):
    new_alpha, new_beta = decay_posterior(alpha, beta, a0, b0, decay, dv)
    assert min(a0, alpha) <= new_alpha <= max(a0, alpha)
    assert min(b0, beta) <= new_beta <= max(b0, beta)
    # And more versions never move it away from the prior.
    older_alpha, _ = decay_posterior(alpha, beta, a0, b0, decay, dv + 1)
    assert abs(older_alpha - a0) <= abs(new_alpha - a0)


def test_decay_known_value():
    assert decay_posterior(9.0, 3.0, 1.0, 1.0, 0.5, 2) == (3.0, 1.5)
    assert decay_posterior(9.0, 3.0, 1.0, 1.0, 1.0, 7) == (9.0, 3.0)
    assert decay_posterior(9.0, 3.0, 1.0, 1.0, 0.5, 10**9) == (1.0, 1.0)  # underflow: prior


# ------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "args, fragment",
    [
        ((1, 0, 0, 1.0, 1.0), "k"),
        ((3, 0, 2, 1.0, 1.0), "n"),
        ((2, 3, 4, 1.0, 1.0), "s"),
        ((-1, 0, 4, 1.0, 1.0), "n"),
        ((1, -1, 4, 1.0, 1.0), "s"),
        ((1, 0, 4, 0.0, 1.0), "alpha0"),
        ((1, 0, 4, 1.0, -2.0), "beta0"),
        ((1, 0, 4, math.nan, 1.0), "alpha0"),
        ((1, 0, 4, 1.0, math.inf), "beta0"),
        ((1.5, 0, 4, 1.0, 1.0), "n"),
        ((1, 0, True, 1.0, 1.0), "k"),
        ((1, 0, 4, "x", 1.0), "alpha0"),
    ],
)
def test_p_eff_rejects_bad_input(args, fragment):
    with pytest.raises(ValueError, match=fragment):
        p_eff(*args)


def test_other_functions_reject_bad_input():
    with pytest.raises(ValueError, match="tau_low"):
        abandon_thresholds(8, 1.0, 1.0, 1.5)
    with pytest.raises(ValueError, match="tau_low"):
        decide(1, 0, 8, 1.0, 1.0, -0.1)
    with pytest.raises(ValueError, match="policy"):
        plan_group("greedy", 8, 1.0, 1.0, 0.5)
    with pytest.raises(ValueError, match="k"):
        plan_group("sara", 0, 1.0, 1.0, 0.5)
    plan = plan_group("sara", 8, 1.0, 1.0, 0.5)
    with pytest.raises(ValueError, match="k=8"):
        issue_target(plan, 5, 4)
    with pytest.raises(ValueError, match="failures"):
        issue_target(plan, 0, -1)
    with pytest.raises(ValueError, match="decay"):
        decay_posterior(2.0, 2.0, 1.0, 1.0, 1.5, 1)
    with pytest.raises(ValueError, match="versions_elapsed"):
        decay_posterior(2.0, 2.0, 1.0, 1.0, 0.5, -1)
    with pytest.raises(ValueError, match="alpha"):
        decay_posterior(0.0, 2.0, 1.0, 1.0, 0.5, 1)


# ------------------------------------------------------------------------- shared cases


def _count_and_compare(case, successes, failures):
    """What the Lua scripts do: compare counts with the plan's thresholds, nothing more."""
    if successes and failures:
        return "commit"
    if case["policy"] == "sara":
        if failures >= case["after_failures"] or successes >= case["after_successes"]:
            return "abandon"
    return "continue"


def test_shared_cases_are_deterministic_and_well_formed():
    cases = generate_cases(seed=3, count=120)
    assert cases == generate_cases(seed=3, count=120)
    assert len(cases) == 120
    assert {c["policy"] for c in cases} == set(POLICIES)
    assert any(c["skip"] for c in cases) and any(c["final"] == "committed" for c in cases)
    assert any(c["final"] == "abandoned" for c in cases)
    for case in cases:
        assert len(case["outcomes"]) == len(case["decisions"]) == len(case["issued_after"])
        assert set(case["outcomes"]) <= {0, 1}
        if case["skip"]:
            assert case["outcomes"] == [] and case["initial_issue"] == 0
            assert case["final"] == "skipped" and case["policy"] == "sara"


def test_shared_cases_agree_with_threshold_counting():
    # The Lua scripts decide by counting against the thresholds; the reference by p_eff.
    for case in generate_cases():
        successes = failures = 0
        issued = case["initial_issue"]
        for i, outcome in enumerate(case["outcomes"]):
            assert i < issued  # every outcome is for a rollout already issued
            successes += outcome
            failures += 1 - outcome
            assert case["decisions"][i] == _count_and_compare(case, successes, failures)
            assert case["issued_after"][i] >= issued
            issued = case["issued_after"][i]
            if case["decisions"][i] == "commit":
                assert issued == case["k"]
        if case["final"] == "saturated":
            assert len(case["outcomes"]) == case["k"] and case["decisions"][-1] == "continue"


# ---------------------------------------------------------------- half-life in epochs of the pool


def test_history_survives_to_the_next_visit_at_the_default_half_life():
    from sara_service.settings import DEFAULT_HALF_LIFE, Settings

    s = Settings()
    # one epoch later, any number of policy versions later (13 per epoch in the benchmark)
    weight = decay_weight(s.posterior_decay, 13, s.posterior_half_life, 1.0)
    assert s.posterior_half_life == DEFAULT_HALF_LIFE and weight >= 0.5 ** (1 / DEFAULT_HALF_LIFE)
    assert weight > 0.25  # the old default, 0.5 per version, kept 0.5 ** 13 = 1.2e-4
    a, b = decay_posterior(9.0, 3.0, 1.0, 1.0, s.posterior_decay, 13, s.posterior_half_life, 1.0)
    assert a == pytest.approx(1 + 8 * weight) and b == pytest.approx(1 + 2 * weight)


def test_half_life_halves_the_evidence_once_per_half_life():
    assert decay_posterior(9.0, 3.0, 1.0, 1.0, 1.0, 0, 2.0, 2.0) == (5.0, 2.0)
    assert decay_posterior(9.0, 3.0, 1.0, 1.0, 1.0, 0, 2.0, 4.0) == (3.0, 1.5)
    assert decay_posterior(9.0, 3.0, 1.0, 1.0, 1.0, 0, math.inf, 40.0) == (9.0, 3.0)
    # both clocks together: versions and epochs multiply
    assert decay_weight(0.5, 1, 1.0, 1.0) == 0.25


def test_half_life_inputs_are_checked():
    with pytest.raises(ValueError, match="half_life"):
        decay_weight(1.0, 0, -1.0, 1.0)
    with pytest.raises(ValueError, match="half_life"):
        decay_weight(1.0, 0, float("nan"), 1.0)
    with pytest.raises(ValueError, match="epochs_elapsed"):
        decay_weight(1.0, 0, 1.0, float("nan"))


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_settings_refuse_a_half_life_that_is_not_positive(value, monkeypatch):
    from pydantic import ValidationError

    from sara_service.settings import Settings

    monkeypatch.setenv("SARA_POSTERIOR_HALF_LIFE", value)
    with pytest.raises(ValidationError, match="posterior_half_life"):
        Settings()


def test_settings_accept_an_infinite_half_life_and_the_old_decay_only_in_process(monkeypatch):
    from sara_service.settings import Settings

    monkeypatch.setenv("SARA_POSTERIOR_HALF_LIFE", "inf")
    monkeypatch.setenv("SARA_POSTERIOR_DECAY", "0.5")   # internal: the environment cannot set it
    s = Settings()
    assert s.posterior_half_life == math.inf and s.posterior_decay == 1.0
    assert Settings(posterior_decay=0.5).posterior_decay == 0.5   # a benchmark, in process


# ------------------------------------------------------------- a lower threshold on failures


def test_a_lower_failing_threshold_abandons_an_all_fail_prefix_later():
    # uniform prior, k = 8: p_eff after n failures (or successes) is (8 - n) / 9
    both = plan_group("sara", 8, 1.0, 1.0, 0.5)
    rare = plan_group("sara", 8, 1.0, 1.0, 0.5, tau_fail=0.3)
    assert (both.after_failures, both.after_successes) == (4, 4)
    assert (rare.after_failures, rare.after_successes) == (6, 4)   # 2/9 < 0.3 <= 3/9
    assert rare.initial_issue == 4 and len(rare.p_eff_fail) == 7
    # the baselines never abandon, whatever the thresholds
    assert plan_group("dynamic_sampling", 8, 1.0, 1.0, 0.5, tau_fail=0.3).after_failures == 9


def test_the_failing_threshold_is_a_probability():
    with pytest.raises(ValueError, match="tau_fail"):
        plan_group("sara", 8, 1.0, 1.0, 0.5, tau_fail=1.5)


def test_settings_take_the_failing_threshold_with_a_fixed_tau_only():
    from pydantic import ValidationError

    from sara_service.settings import Settings

    assert Settings(tau_low_fail=0.3).tau_low_fail == 0.3
    with pytest.raises(ValidationError, match="SARA_TAU_LOW_FAIL"):
        Settings(tau_low="auto", tau_low_fail=0.3)
    with pytest.raises(ValidationError, match="SARA_TAU_LOW_FAIL"):
        Settings(effective="reward", tau_low_fail=0.3)
