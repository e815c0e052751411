"""Reinforce-Ada's rules (math/reinforce_ada.py): the stop rules, the rounds, and the balanced
down-sampling, as its paper and reference settings describe them."""

from __future__ import annotations

import pytest
from sara_service.math.reinforce_ada import (
    decide_round, keep_slots, next_issue, plan_rounds, round_rule,
)


def test_the_two_rules_ask_for_the_signal_the_paper_names():
    balanced = round_rule(8, 4, "balanced")       # keep 4: two of each
    assert (balanced.successes, balanced.failures) == (2, 2)
    assert round_rule(8, 5, "balanced").failures == 3
    positive = round_rule(8, 4, "positive")       # one success is enough
    assert (positive.successes, positive.failures) == (1, 0)
    assert balanced.stops(2, 2) and not balanced.stops(1, 7) and positive.stops(1, 0)
    with pytest.raises(ValueError, match="rule must be one of"):
        round_rule(8, 4, "greedy")
    with pytest.raises(ValueError, match="keep >= 2"):
        round_rule(8, 1, "balanced")


def test_a_group_waits_for_its_round_then_stops_or_takes_another():
    rule = round_rule(4, 4, "balanced")
    k = 12
    # round 1 still out: nothing is decided, nothing more issued
    assert decide_round([True, False], 4, k, rule) == "continue"
    assert next_issue(2, 4, k, rule) == 4
    # round 1 in, one success only: another round
    assert decide_round([True, False, False, False], 4, k, rule) == "continue"
    assert next_issue(4, 4, k, rule) == 8
    # two of each by the end of round 2: committed with what it has
    assert decide_round([True, False, False, False, True, False, False, False], 8, k,
                        rule) == "commit"
    # pure at the budget: left to the saturated drop, as under DS
    assert decide_round([False] * 12, 12, k, rule) == "continue"
    assert next_issue(12, 12, k, rule) == 12
    # mixed at the budget without the rule's signal: delivered all the same
    assert decide_round([True] + [False] * 11, 12, k, rule) == "commit"


def test_the_positive_rule_stops_at_a_success_and_abandons_an_all_success_round():
    rule = round_rule(4, 4, "positive")
    assert decide_round([False, True, False, False], 4, 16, rule) == "commit"
    assert decide_round([True] * 4, 4, 16, rule) == "abandon"   # no gradient in it
    assert decide_round([False] * 4, 4, 16, rule) == "continue"


@pytest.mark.parametrize("outcomes,keep,kept", [
    ([True, False, False, True, True, False], 4, [0, 1, 2, 3]),   # two of each, earliest
    ([False, False, False, True, False, False], 4, [0, 1, 2, 3]),  # one success: 3 failures
    ([True, True, True, False, True, True], 4, [0, 1, 2, 3]),     # one failure: 3 successes
    ([False, True, False, False, False, True, False, True], 4, [0, 1, 2, 5]),
    ([True, False], 4, [0, 1]),                                    # no more than keep: all
    ([True, True, False, False, False, True], 3, [0, 2, 3]),        # keep 3: 1 success, 2 fail
])
def test_keep_slots_balances_successes_and_failures(outcomes, keep, kept):
    assert keep_slots(outcomes, keep) == kept


def test_the_plan_issues_one_round_and_never_abandons():
    plan = plan_rounds(32, 1.0, 1.0, round_rule(8, 4, "balanced"))
    assert plan.policy == "reinforce_ada" and plan.initial_issue == 8
    assert plan.after_failures == plan.after_successes == 33
    assert plan.rounds == (8, 2, 2) and not plan.deliver_saturated
    with pytest.raises(ValueError, match="whole number of rounds"):
        plan_rounds(30, 1.0, 1.0, round_rule(8, 4, "balanced"))
