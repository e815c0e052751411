"""The demo's comparison figures: where a curve reaches a target, and the side-by-side summary."""

from __future__ import annotations

import math

import pytest
from sara_demo.compare import compare, crossing, standard_error

CURVE = [{"accuracy": 0.40, "rollouts_cum": 0, "tokens_cum": 0},
         {"accuracy": 0.50, "rollouts_cum": 1000, "tokens_cum": 3000},
         {"accuracy": 0.45, "rollouts_cum": 2000, "tokens_cum": 6000},
         {"accuracy": 0.70, "rollouts_cum": 3000, "tokens_cum": 9000}]


def test_crossing_interpolates_between_the_evaluations_around_the_first_reach():
    assert crossing(CURVE, 0.45) == pytest.approx(500)
    assert crossing(CURVE, 0.45, key="tokens_cum") == pytest.approx(1500)
    # the first time the curve reaches 0.6 is between 2000 (0.45) and 3000 (0.70)
    assert crossing(CURVE, 0.60) == pytest.approx(2000 + 1000 * 0.15 / 0.25)
    assert crossing(CURVE, 0.40) == 0.0
    assert crossing(CURVE, 0.71) is None


def test_standard_error_is_binomial():
    assert standard_error(0.5, 2500) == pytest.approx(0.01)
    assert math.isnan(standard_error(0.5, 0))


def _arm(acc, rollouts, delivered, evals):
    return {"accuracy_after": acc, "rollouts_spent": rollouts, "groups_delivered": delivered,
            "rollouts_per_mixed_group": rollouts / delivered, "evals": evals}


def test_compare_reads_both_curves_at_the_same_targets():
    ds_curve = [{"accuracy": 0.40, "rollouts_cum": 0, "tokens_cum": 0},
                {"accuracy": 0.60, "rollouts_cum": 2000, "tokens_cum": 6000},
                {"accuracy": 0.58, "rollouts_cum": 3000, "tokens_cum": 9000}]
    sara = _arm(0.70, 3000, 150, CURVE)
    ds = _arm(0.58, 3000, 100, ds_curve)
    out = compare(0.40, 1000, sara, ds)
    assert out["ds_final_accuracy"] == 0.58
    assert out["targets"] == pytest.approx({"ds_final": 0.58, "halfway": 0.49})
    # DS first reached its own final 0.58 at 1800 rollouts, not at the end of its budget
    final = out["rollouts_to_ds_final"]
    assert final["ds"] == pytest.approx(1800)
    assert final["sara"] == pytest.approx(2000 + 1000 * 0.13 / 0.25)
    assert final["ratio"] == pytest.approx(final["sara"] / 1800)
    half = out["rollouts_to_halfway"]
    assert (half["sara"], half["ds"]) == (pytest.approx(900), pytest.approx(900))
    assert out["tokens_to_halfway"]["ds"] == pytest.approx(2700)
    assert out["rollouts_per_mixed_group_ratio"] == pytest.approx(20 / 30)
    assert out["accuracy_difference"] == pytest.approx(0.12)
    never = compare(0.40, 1000, _arm(0.5, 3000, 150, CURVE[:2]), ds)
    assert never["rollouts_to_ds_final"]["sara"] is None
    assert never["rollouts_to_ds_final"]["ratio"] is None
