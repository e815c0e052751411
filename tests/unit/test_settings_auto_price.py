"""SARA_AUTO_PRICE: tokens prices the cost-aware thresholds, so it is refused with a fixed τ."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from sara_service.settings import Settings


def test_the_rollout_price_is_the_default():
    assert Settings().auto_price == "rollouts" and Settings(tau_low="auto").auto_price == "rollouts"


def test_tokens_are_read_from_the_environment_under_auto(monkeypatch):
    monkeypatch.setenv("SARA_TAU_LOW", "auto")
    monkeypatch.setenv("SARA_AUTO_PRICE", "tokens")
    assert Settings().auto_price == "tokens"


@pytest.mark.parametrize("tau", [0.5, 0.0])
def test_tokens_with_a_fixed_tau_are_refused(tau):
    with pytest.raises(ValidationError) as info:
        Settings(tau_low=tau, auto_price="tokens")
    message = str(info.value)
    assert "SARA_AUTO_PRICE=tokens" in message and "SARA_TAU_LOW=auto" in message


def test_an_unknown_price_is_refused():
    with pytest.raises(ValidationError):
        Settings(tau_low="auto", auto_price="seconds")
