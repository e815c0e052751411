"""GRESO's pure parts (sara_service.math.selection): the trailing zero-variance streak, the keep
chance and the rates' step, each against the rule written out by hand."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sara_service.math.selection import GresoParams, greso_adapt, greso_keep_chance, greso_streak


@pytest.mark.parametrize("observations, streak", [
    ([], ("M", 0)),
    ([[0, "S"]], ("S", 1)),
    ([[0, "F"], [1, "S"], [2, "S"]], ("S", 2)),
    ([[0, "S"], [1, "S"], [2, "M"]], ("M", 0)),
    ([[3, "F", 0.2], [1, "M"], [2, "F"]], ("F", 2)),      # ordered by version; abandoned counts
    ([[0, "S"], [1, "F"], [2, "F"], [3, "F"]], ("F", 3)),
])
def test_the_streak_is_the_trailing_run_of_one_pure_side(observations, streak):
    assert greso_streak(observations) == streak


def test_keep_chance_is_p_to_the_streak_floored():
    params = GresoParams()
    assert greso_keep_chance("M", 0, 0.5, 0.5) == 1.0
    assert greso_keep_chance("S", 0, 0.5, 0.5) == 1.0
    assert greso_keep_chance("S", 3, 0.5, 0.9) == pytest.approx(0.125)
    assert greso_keep_chance("F", 3, 0.5, 0.9) == pytest.approx(0.729)
    assert greso_keep_chance("F", 50, 0.5, 0.5) == params.floor   # never dropped for good


@given(st.floats(0.05, 0.95), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_a_rate_steps_once_toward_its_target_within_bounds(p, share, target):
    params = GresoParams()
    moved = greso_adapt(p, share, target, params)
    assert params.p_min <= moved <= params.p_max
    assert abs(moved - p) <= params.step + 1e-12
    if share >= target:
        assert moved <= p    # too many zero-variance groups of this kind: skip more
    else:
        assert moved >= p


def test_the_target_splits_one_third_easy_two_thirds_hard():
    params = GresoParams(target=0.3)
    assert params.target_easy == pytest.approx(0.1)
    assert params.target_hard == pytest.approx(0.2)
