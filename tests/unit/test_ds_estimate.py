"""The live DS estimate from audit sampling (pure math)."""

from __future__ import annotations

import random

import pytest

from sara_service.math import ds_estimate as ds
def tally(**kw):
    base = dict(decided=1000, mixed_before_abandon=400, would_abandon=500, audited=25,
                audited_mixed=5)
    base.update(kw)
    return ds.GroupTally(**base)


def test_without_abandons_the_figure_is_measured_and_the_interval_is_the_binomial_one():
    t = tally(mixed_before_abandon=400, would_abandon=0, audited=0, audited_mixed=0)
    est = ds.ds_rollouts_per_effective_group(t, 8)
    assert est.point == pytest.approx(8 * 1000 / 400)
    assert est.low < est.point < est.high
    # q = 0.4 +- 1.96 sqrt(.24/1000) ~ 0.4 +- 0.03
    assert est.low == pytest.approx(8 / 0.4304, rel=0.01)


def test_abandons_without_audits_give_no_point_and_an_interval_past_the_bounds():
    est = ds.ds_rollouts_per_effective_group(tally(audited=0, audited_mixed=0), 8)
    assert est.point is None
    # r = 1 (every abandon was mixed) and r = 0 (none was), each widened by the groups' spread
    assert 8 * 1000 / 900 * 0.95 < est.low < 8 * 1000 / 900 < 8 * 1000 / 400 < est.high


def test_the_point_uses_the_audited_false_abandon_rate():
    est = ds.ds_rollouts_per_effective_group(tally(), 8)
    assert est.point == pytest.approx(8 / ((400 + 500 * 0.2) / 1000))
    assert ds.false_abandon_rate(tally()).point == pytest.approx(0.2)


def test_an_audit_rate_of_zero_still_has_an_interval_that_allows_false_abandons():
    q = ds.mixed_fraction(tally(audited_mixed=0))
    assert q.point == pytest.approx(0.4) and q.high > 0.45


def test_nothing_decided_gives_nothing():
    assert ds.ds_rollouts_per_effective_group(ds.GroupTally(0, 0, 0, 0, 0), 8) == \
        ds.Interval(None, None, None)


def test_tally_from_counters_moves_audits_out_of_committed_and_into_would_abandon():
    t = ds.tally_from_counters(committed=50, abandoned=30, completed_pure=20, audits_mixed=4,
                               audits_pure=6)
    assert t == ds.GroupTally(decided=100, mixed_before_abandon=46, would_abandon=40, audited=10,
                              audited_mixed=4)


def test_wilson_matches_a_known_value():
    w = ds.wilson(5, 25)
    assert (w.low, w.high) == pytest.approx((0.0886, 0.3913), abs=5e-4)
    assert ds.wilson(0, 0) == ds.Interval(None, None, None)


def test_net_saving_is_positive_when_spending_less_than_ds():
    figure = ds.Interval(20.0, 18.0, 22.0)
    saving = ds.net_saving(spent=1600, effective=100, ds=figure)
    assert saving.point == pytest.approx(0.2) and saving.low < saving.point < saving.high
    saved = ds.net_rollouts_saved(spent=1600, effective=100, ds=figure)
    assert (saved.point, saved.low, saved.high) == (400, 200, 600)


def test_the_interval_covers_the_truth_about_95_percent_of_the_time():
    """Two-phase sampling with known rates: groups mixed-before-abandon with 0.3, would-abandon
    with 0.5, of which 20% would have been mixed; 5% of groups audited."""
    rng = random.Random(0)
    k, n_groups, runs, hits = 8, 1500, 400, 0
    truth = k / (0.3 + 0.5 * 0.2)
    for _ in range(runs):
        c = a = n = m = 0
        for _ in range(n_groups):
            u = rng.random()
            if u < 0.3:
                c += 1
            elif u < 0.8:
                a += 1
                if rng.random() < 0.05:
                    n += 1
                    m += rng.random() < 0.2
        est = ds.ds_rollouts_per_effective_group(ds.GroupTally(n_groups, c, a, n, m), k)
        hits += est.low <= truth <= (est.high or float("inf"))
    assert 0.92 <= hits / runs <= 0.99
