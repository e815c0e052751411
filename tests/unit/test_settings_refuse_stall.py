"""A configuration under which every new prompt would be skipped is refused at start, with a
message that names k, tau_low and the prior (it used to serve, open nothing and say nothing)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from sara_service.settings import Settings


@pytest.mark.parametrize("over", [
    {"group_size": 2, "tau_low": 0.5},                          # p_eff(0) = 1/3 < 0.5
    {"prior_alpha": 0.2, "prior_beta": 0.2, "tau_low": 0.5},     # a prior that expects saturation
])
def test_a_configuration_that_skips_every_new_prompt_is_refused(over):
    with pytest.raises(ValidationError) as info:
        Settings(**over)
    message = str(info.value)
    assert "every new prompt would be skipped" in message
    assert f"k={over.get('group_size', 8)}" in message and "tau_low=0.5" in message
    assert "prior=uniform" in message and "Beta(" in message


@pytest.mark.parametrize("over", [
    {"group_size": 2, "tau_low": 0.3},
    {"group_size": 2, "tau_low": 0.5, "policy": "dynamic_sampling"},   # baselines never skip
    {"group_size": 8, "tau_low": 0.5},
])
def test_configurations_that_can_open_a_group_are_accepted(over):
    assert Settings(**over).group_size == over["group_size"]


@pytest.mark.parametrize("over", [
    {"group_size": 2, "tau_low": "auto"},     # auto never plans a skip for a fresh prompt
    {"prior_alpha": 0.2, "prior_beta": 0.2, "tau_low": "auto", "tau_floor": 0.3},
])
def test_auto_is_never_refused_as_a_stall(over):
    assert Settings(**over).tau_low == "auto"


def test_tau_low_auto_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("SARA_TAU_LOW", "auto")
    monkeypatch.setenv("SARA_TAU_FLOOR", "0.2")
    s = Settings()
    assert s.tau_low == "auto" and s.tau_floor == 0.2
    monkeypatch.setenv("SARA_TAU_LOW", "0.4")
    assert Settings().tau_low == 0.4
    monkeypatch.setenv("SARA_TAU_LOW", "often")
    with pytest.raises(ValidationError):
        Settings()
