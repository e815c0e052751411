"""Pilot-Commit's rules (math/pilot_commit.py): the band in successes, inclusive at both ends as
its scripts compare, the plan (the pilot first, the budget after), the decision on a complete
pilot, and which prompts are excluded."""

from __future__ import annotations

import pytest
from sara_service.math.allocation import p_eff
from sara_service.math.pilot_commit import (
    PilotBand, decide_pilot, excluded, pilot_band, pilot_issued, plan_pilot,
)


def test_the_scripts_band_on_their_pilots_is_inclusive_at_both_ends():
    # lower 0.125, upper 0.25: pass rates in [0.125, 0.75]
    assert pilot_band(32, 0.125, 0.75) == PilotBand(32, 4, 24)
    assert pilot_band(16, 0.125, 0.75) == PilotBand(16, 2, 12)
    assert pilot_band(8, 0.125, 0.75) == PilotBand(8, 1, 6)
    # the yaml default [0.25, 0.75]; a rate between two counts takes the counts inside it
    assert pilot_band(8, 0.25, 0.75) == PilotBand(8, 2, 6)
    assert pilot_band(10, 0.15, 0.75) == PilotBand(10, 2, 7)


def test_a_band_that_would_commit_a_pure_pilot_or_nothing_is_refused():
    with pytest.raises(ValueError, match="every committed pilot is mixed"):
        pilot_band(8, 0.0, 0.75)         # 0 successes would be committed
    with pytest.raises(ValueError, match="every committed pilot is mixed"):
        pilot_band(8, 0.125, 1.0)        # 8 of 8 would be
    with pytest.raises(ValueError, match="every committed pilot is mixed"):
        pilot_band(8, 0.3, 0.35)         # no count of 8 lies in it
    with pytest.raises(ValueError, match="low <= high"):
        pilot_band(8, 0.75, 0.125)
    with pytest.raises(ValueError, match="at least 2"):
        pilot_band(1, 0.125, 0.75)


def test_the_plan_issues_the_pilot_and_fills_to_the_budget_only_after():
    plan = plan_pilot(32, 1.0, 1.0, pilot_band(8, 0.125, 0.75))
    assert plan.policy == "pilot_commit" and plan.k == 32 and plan.initial_issue == 8
    assert plan.pilot == (8, 1, 6)
    assert not plan.skip and not plan.deliver_saturated
    with pytest.raises(ValueError, match="smaller than the budget"):
        plan_pilot(8, 1.0, 1.0, pilot_band(8, 0.125, 0.75))


def test_a_pilot_is_decided_only_when_complete_and_then_on_its_band():
    band = pilot_band(8, 0.25, 0.75)     # 2..6 successes
    assert decide_pilot([False] * 7, band) == "continue"   # not even a hopeless prefix stops it
    assert decide_pilot([True] * 7, band) == "continue"
    assert decide_pilot([True, True] + [False] * 6, band) == "commit"    # the low edge
    assert decide_pilot([True] * 6 + [False] * 2, band) == "commit"      # the high edge
    assert decide_pilot([True] + [False] * 7, band) == "abandon"         # mixed, too hard
    assert decide_pilot([True] * 7 + [False], band) == "abandon"         # mixed, too easy
    assert decide_pilot([False] * 8, band) == "abandon"
    assert decide_pilot([True] * 8, band) == "abandon"


def test_only_a_prompt_whose_last_group_ended_all_successes_is_excluded():
    assert excluded("S", 1) and excluded("S", 3)
    assert not excluded("F", 2) and not excluded("M", 0)


def test_sara_stopping_issues_the_pilot_to_its_threshold_and_stops_a_failing_prefix():
    band = pilot_band(8, 0.125, 0.75)
    plan = plan_pilot(32, 1.0, 1.0, band, tau_low=0.5)
    # SARA's threshold for a group of 8: the first all-fail prefix whose chance of a mixed group
    # of 8 (allocation.p_eff) is below tau_low
    thr = plan.after_failures
    assert p_eff(thr, 0, 8, 1.0, 1.0) < 0.5 <= p_eff(thr - 1, 0, 8, 1.0, 1.0)
    assert plan.initial_issue == thr < 8
    assert decide_pilot([False] * (thr - 1), band, thr) == "continue"
    assert decide_pilot([False] * thr, band, thr) == "abandon"
    assert decide_pilot([True] + [False] * (thr - 1), band, thr) == "continue"
    assert decide_pilot([True] * 7, band, thr) == "continue"   # a solved pilot runs whole
    assert pilot_issued([False] * (thr - 1), band, thr) == thr
    assert pilot_issued([False, True], band, thr) == 8
    # without it the pilot is issued whole and never stopped
    whole = plan_pilot(32, 1.0, 1.0, band)
    assert whole.initial_issue == 8 and whole.after_failures == 33
    with pytest.raises(ValueError, match="before its first rollout"):
        plan_pilot(32, 1.0, 1.0, band, tau_low=1.0)
