"""Knapsack RL's split of a batch's budget (math.knapsack): the greedy split against an
exhaustive search of every size vector, and the rules its public code follows."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sara_service.math.knapsack import (
    KnapsackParams, estimated_rate, group_value, mixed_cost, sized_plan, split_budget,
)

PARAMS = KnapsackParams(min_n=2, max_n=10)


def best_total_value(rates: list[float], budget: int, params: KnapsackParams) -> float:
    """The optimum by brute force: every vector of sizes in [min_n, max_n] spending `budget`."""
    best = -math.inf
    for sizes in itertools.product(range(params.min_n, params.max_n + 1), repeat=len(rates)):
        if sum(sizes) == budget:
            best = max(best, sum(group_value(n, p) for n, p in zip(sizes, rates)))
    return best


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.02, 0.98), min_size=1, max_size=4), st.integers(3, 6))
@example([0.1, 0.2, 0.15], 4)   # need 45 against a budget of 12: split by value alone
def test_the_greedy_split_reaches_the_exhaustive_optimum(rates, k):
    sizes = split_budget(rates, k, PARAMS)
    budget = len(rates) * k
    assert sum(sizes) == budget
    need = sum(mixed_cost(p, PARAMS) for p in rates)
    if need >= budget:   # no surplus: the whole budget is split by value
        total = sum(group_value(n, p) for n, p in zip(sizes, rates))
        assert total == pytest.approx(best_total_value(rates, budget, PARAMS), rel=1e-12)
        assert all(PARAMS.min_n <= n <= PARAMS.max_n for n in sizes)


def test_the_rules_for_unseen_pure_and_mixed_prompts():
    # budget 64; minimums 2 for the known prompts, k for the unseen one; the mixed prompts'
    # need (log 0.1 / log 0.5 -> 3, log 0.1 / log 0.7 -> 6) is 9 < 42 left: the DP gets 9 and
    # the surplus 33 goes to the two hopeless prompts (16 and 17 each, the first the extra one)
    sizes = split_budget([None, 0.0, 1.0, 0.5, 0.3, 0.0, 1.0, 1.0], 8, KnapsackParams())
    assert sizes[0] == 8 and sizes[2] == sizes[6] == sizes[7] == 2
    assert sizes[3] + sizes[4] == 2 + 2 + 9
    assert (sizes[1], sizes[5]) == (2 + 17, 2 + 16)
    assert sum(sizes) == 64


def test_without_hard_prompts_the_surplus_goes_to_the_others_then_to_all_alike():
    assert split_budget([1.0, 1.0, None], 8, KnapsackParams()) == [8, 8, 8]
    sizes = split_budget([0.5, 1.0], 8, KnapsackParams())   # need 3, surplus 11 -> the solved
    assert sizes == [5, 11]
    assert split_budget([0.5, 0.5], 8, KnapsackParams()) == [8, 8]   # only inside prompts


def test_a_budget_the_inside_prompts_cannot_take_goes_to_the_hard_ones():
    sizes = split_budget([0.4, 0.0], 8, KnapsackParams(min_n=2, max_n=4))
    assert sizes == [4, 12]


def test_value_cost_and_rate():
    assert group_value(8, 0.0) == group_value(8, 1.0) == 0.0
    assert group_value(2, 0.5) == pytest.approx(0.5 * 0.5 * 0.25)
    assert mixed_cost(0.5, KnapsackParams()) == 3
    assert mixed_cost(0.01, KnapsackParams(max_n=64)) == 64   # capped
    assert estimated_rate(None, 3, 1) is None
    assert estimated_rate("F", 3, 1) == 0.0 and estimated_rate("S", 0, 5) == 1.0
    assert estimated_rate("M", 3.0, 1.0) == 0.75


def test_params_and_plans():
    with pytest.raises(ValueError, match="min_n <= max_n"):
        KnapsackParams(min_n=8, max_n=4)
    with pytest.raises(ValueError, match="confidence"):
        KnapsackParams(confidence=1.0)
    # SARA would skip a group of 2 (it starts at 1/3 < 0.5): the group runs whole, as DS's
    assert sized_plan("sara", 2, 1.0, 1.0, 0.5).policy == "dynamic_sampling"
    assert sized_plan("sara", 8, 1.0, 1.0, 0.5).policy == "sara"
