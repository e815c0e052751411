"""Verifiers with partial credit: the `format:` wrapper and countdown's credit for
closeness; both keep `score`'s promise never to raise."""

from __future__ import annotations

import pytest

from sara_worker import verifiers
from sara_worker.verifiers import get, score
from sara_worker.verifiers.countdown import closeness_credit
from sara_worker.verifiers.format import well_formed, with_bonus

COUNTDOWN = {"numbers": [3, 5, 7, 2], "target": 29}


@pytest.mark.parametrize("completion,reward", [
    ("<answer>3 * 7 + 5 + 2 + 0</answer>", 0.1),   # well formed, uses 0 (not given): wrong
    ("work...\n<answer>(3 + 2) * 5 + 7 - 3</answer>", 0.1),   # 3 used twice: wrong, formed
    ("<answer>7 * 3 + 5 + 2</answer>", 0.1),       # 28: wrong, formed
    ("<answer>7 * (3 + 2) - 5 - 2 + 1</answer>\n", 0.1),
    ("<answer>5 * 7 - 3 * 2</answer>", 1.0),       # 29: correct (capped at 1.0)
    ("5 * 7 - 3 * 2", 1.0),                        # correct without the tag: no bonus needed
    ("7 * 3 + 5 + 2", 0.0),                        # wrong and not formed
    ("<answer></answer>", 0.0),                    # an empty answer is not well formed
    ("<answer>28</answer> and then more text", 0.0),   # the answer must come last
])
def test_format_countdown_is_the_shaped_reward(completion, reward):
    assert score("format:countdown", completion, None, COUNTDOWN) == pytest.approx(reward)


def test_format_wraps_any_verifier_and_takes_its_options():
    assert score("format:exact", "<answer>41</answer>", "42", {}) == pytest.approx(0.1)
    assert score("format:exact", "42", "42", {}) == 1.0
    meta = {"format_bonus": 0.25, "format_pattern": r"^Final: \d+$"}
    assert score("format:exact", "Final: 41", "42", meta) == pytest.approx(0.25)
    assert score("format:exact", "final 41", "42", meta) == 0.0
    assert score("format:nonexistent", "x", None, {}) == 0.0   # unknown inner: 0, no raise
    with pytest.raises(verifiers.UnknownVerifier):
        get("format:nonexistent")


def test_format_of_a_slow_verifier_is_slow_too():
    get("format:math")
    assert verifiers.is_blocking("format:math") and not verifiers.is_blocking("format:exact")


def test_the_bonus_never_lifts_past_the_cap_nor_lowers_a_reward():
    assert with_bonus(0.0, True, 0.1, 1.0) == pytest.approx(0.1)
    assert with_bonus(0.95, True, 0.1, 1.0) == 1.0
    assert with_bonus(1.2, True, 0.1, 1.0) == 1.2
    assert with_bonus(0.5, False, 0.1, 1.0) == 0.5
    assert well_formed("x <answer> 3 </answer>  \n", {})
    assert not well_formed("<answer>3</answer> then", {})


@pytest.mark.parametrize("completion,reward", [
    ("<answer>5 * 7 - 3 * 2</answer>", 1.0),    # 29 exactly
    ("<answer>5 * 7 - 3 - 2</answer>", 0.45),   # 30: off by 1 of 29 -> 0.5 * 28/29 -> 0.45
    ("<answer>7 * 3 + 5 + 2</answer>", 0.45),   # 28
    ("<answer>5 + 2</answer>", 0.1),            # 7: off by 22 -> 0.5 * 7/29 = 0.12 -> 0.1
    ("<answer>7 * 5 * 3 * 2</answer>", 0.0),    # 210: further than the target itself
    ("<answer>7 * 7</answer>", 0.0),            # 7 used twice: invalid, no credit
    ("<answer>x + 1</answer>", 0.0),
])
def test_countdown_close_gives_credit_for_closeness(completion, reward):
    assert score("countdown_close", completion, None, COUNTDOWN) == pytest.approx(reward)


def test_closeness_credit_options_and_levels():
    from fractions import Fraction

    meta = dict(COUNTDOWN, close_credit=0.8, close_step=0.2)
    assert score("countdown_close", "<answer>5 * 7 - 3 - 2</answer>", None, meta) == \
        pytest.approx(0.6)
    rewards = {closeness_credit(Fraction(v), 29, 0.5, 0.05) for v in range(-100, 100)}
    assert len(rewards) <= 11 and max(rewards) == 0.5 and min(rewards) == 0.0
    assert all(abs(r / 0.05 - round(r / 0.05)) < 1e-9 for r in rewards)
