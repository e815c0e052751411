"""SARA_EFFECTIVE=reward refuses at start what it cannot run (never silently wrong), and a plan
that would skip every prompt; what it can run is accepted."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from sara_service.settings import Settings


@pytest.mark.parametrize("over,named", [
    ({"prior": "history", "tau_low": "auto"}, "prior=history with tau_low=auto"),
    ({"tau_low": "auto", "auto_price": "tokens"}, "auto_price=tokens"),
])
def test_what_the_reward_view_cannot_run_is_refused(over, named):
    with pytest.raises(ValidationError) as info:
        Settings(effective="reward", **over)
    message = str(info.value)
    assert f"SARA_EFFECTIVE=reward does not support {named}" in message
    assert "SARA_EFFECTIVE=outcome" in message
    Settings(effective="outcome", **over)   # the outcome view still runs it


def test_the_cost_aware_threshold_runs_under_the_reward_view_and_never_skips_a_fresh_prompt():
    # k = 2 would skip every prompt at tau_low = 0.5 (below); "auto" starts every fresh prompt
    assert Settings(effective="reward", tau_low="auto").tau_low == "auto"
    assert Settings(effective="reward", tau_low="auto", group_size=2).group_size == 2


def test_per_prompt_plans_run_under_the_reward_view_with_a_fixed_threshold():
    assert Settings(effective="reward", prior="history", tau_low=0.5).prior == "history"


def test_a_mopps_target_other_than_one_half_is_refused_under_the_reward_view():
    with pytest.raises(ValidationError, match="SARA_MOPPS_TARGET=0.3 is a success rate"):
        Settings(effective="reward", selection="mopps", mopps_target=0.3)
    assert Settings(effective="outcome", selection="mopps", mopps_target=0.3)
    assert Settings(effective="reward", selection="epoch", mopps_target=0.3)   # not used


def test_an_asymmetric_prior_is_refused_under_the_reward_view():
    with pytest.raises(ValidationError, match="symmetric Dirichlet"):
        Settings(effective="reward", prior_alpha=1.0, prior_beta=2.0)


def test_a_reward_view_plan_that_skips_every_prompt_is_refused():
    # k = 2, two levels, alpha0 = 1: the rewards differ with chance 1/3 < 0.5
    with pytest.raises(ValidationError, match="every new prompt would be skipped"):
        Settings(effective="reward", group_size=2, tau_low=0.5)
    # four levels assumed: 1 - 4 (1/4)(2/5) = 0.6
    assert Settings(effective="reward", group_size=2, tau_low=0.5, reward_levels=4)


@pytest.mark.parametrize("over", [
    {}, {"policy": "dynamic_sampling"}, {"policy": "uniform"}, {"selection": "dps"},
    {"selection": "history"}, {"selection": "mopps"},
    {"reward_tolerance": 0.01, "reward_levels": 3},
])
def test_what_the_reward_view_runs_is_accepted(over):
    assert Settings(effective="reward", **over).effective == "reward"


def test_the_default_is_the_outcome_view_and_bad_values_are_refused(monkeypatch):
    assert Settings().effective == "outcome"
    monkeypatch.setenv("SARA_EFFECTIVE", "reward")
    monkeypatch.setenv("SARA_REWARD_TOLERANCE", "0.05")
    s = Settings()
    assert (s.effective, s.reward_tolerance) == ("reward", 0.05)
    for bad in ({"effective": "score"}, {"reward_tolerance": 0.0}, {"reward_levels": 1}):
        with pytest.raises(ValidationError):
            Settings(**bad)
