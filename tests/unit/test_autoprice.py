"""AutoPricer: when it refits, and how the live yield and the pool model make the price."""

from __future__ import annotations

import asyncio

import pytest
from sara_service.core import autoprice
from sara_service.core.autoprice import AutoPricer
from sara_service.settings import Settings
from sara_service.store.codec import StoredPosterior


class FakeStore:
    """The reads a refit makes, with values the test sets; it stands for both resource stores
    a refit reads (`run` and `prompts`)."""

    def __init__(self) -> None:
        self.run = self.prompts = self
        self.counters = {"rollouts_completed": 0, "groups_committed": 0, "groups_abandoned": 0,
                         "groups_dropped_saturated": 0}
        self.posteriors: list[StoredPosterior] = []
        self.clock = 0.0   # epochs of the pool so far

    async def counter_values(self, fields):
        return {f: self.counters[f] for f in fields}

    async def sample_posteriors(self, limit):
        return self.posteriors[:limit]

    async def pool_clock(self):
        return self.clock


def _refresh(pricer: AutoPricer, store: FakeStore) -> bool:
    return asyncio.run(pricer.refresh(store, version=0))


def test_before_any_yield_the_price_is_the_prior_fixed_point():
    pricer, store = AutoPricer(Settings(tau_low="auto")), FakeStore()
    assert _refresh(pricer, store)
    assert pricer.rho == pytest.approx(pricer.prior_rho) and pricer.live_rho is None


def test_refits_come_on_each_doubling_then_every_refit_groups():
    pricer, store = AutoPricer(Settings(tau_low="auto", auto_refit_groups=100)), FakeStore()
    refits = []
    for decided in range(0, 600, 4):
        store.counters["groups_committed"] = decided
        if _refresh(pricer, store):
            refits.append(decided)
    assert refits[:4] == [0, 16, 32, 64] and refits[4:6] == [128, 228]


def test_the_live_window_pulls_the_price_from_the_model(monkeypatch):
    monkeypatch.setattr(autoprice, "SHRINK", 10.0)
    pricer, store = AutoPricer(Settings(tau_low="auto", auto_refit_groups=16)), FakeStore()
    _refresh(pricer, store)
    # 1,000 effective groups at 40 rollouts each since the last refit
    store.counters.update(rollouts_completed=40_000, groups_committed=1000)
    assert _refresh(pricer, store)
    assert pricer.live_rho == 40.0
    expected = (40_000 + 10.0 * pricer.model_rho) / (1000 + 10.0)
    assert pricer.rho == pytest.approx(expected)
    # a price that says a mixed group is worth 40 rollouts: a fresh prompt never abandons at k=8
    assert pricer.fresh_plan().after_failures == 9


def test_a_pool_of_hopeless_prompts_makes_runs_of_failures_stop_early():
    pricer, store = AutoPricer(Settings(tau_low="auto", group_size=16)), FakeStore()
    # half the prompts failed 12 times in a row, half were mixed 6:6
    store.posteriors = ([StoredPosterior(alpha=1.0, beta=13.0, version=0)] * 200
                        + [StoredPosterior(alpha=7.0, beta=7.0, version=0)] * 200)
    _refresh(pricer, store)
    plan = pricer.fresh_plan()
    assert plan.after_failures <= 4 and not plan.skip
    # a prompt with its own run of failures is not worth starting at that price
    assert pricer.plan_for(1.0, 9.0).skip
    assert pricer.snapshot()["abandon_after_failures"] == plan.after_failures


class TokenStore(FakeStore):
    """FakeStore with the token counters a refit under auto_price=tokens also reads."""

    def __init__(self) -> None:
        super().__init__()
        self.counters.update(tokens_generated=0, learned_success_rollouts=0,
                             learned_success_tokens=0, learned_failure_rollouts=0,
                             learned_failure_tokens=0)


def test_the_token_price_learns_the_lengths_and_prices_groups_in_tokens(monkeypatch):
    monkeypatch.setattr(autoprice, "SHRINK", 10.0)
    settings = Settings(tau_low="auto", auto_price="tokens", auto_refit_groups=16)
    pricer, store = AutoPricer(settings), TokenStore()
    # before anything is seen every rollout costs max_tokens: the rollout plan, scaled
    assert pricer.prior_rho == pytest.approx(settings.max_tokens * AutoPricer(
        Settings(tau_low="auto")).prior_rho, rel=1e-9)
    _refresh(pricer, store)
    store.counters.update(groups_committed=1000, rollouts_completed=20_000,
                          tokens_generated=1_600_000, learned_success_rollouts=8_000,
                          learned_success_tokens=400_000, learned_failure_rollouts=12_000,
                          learned_failure_tokens=1_200_000)
    assert _refresh(pricer, store)
    assert (pricer.lengths.success, pricer.lengths.failure) == (50.0, 100.0)
    assert pricer.live_rho == 1600.0
    assert pricer.rho == pytest.approx((1_600_000 + 10.0 * pricer.model_rho) / 1010.0)
    shown = pricer.snapshot()
    assert shown["price"] == "tokens" and shown["tokens_failure"] == 100.0


def test_a_window_without_failures_prices_them_as_successes():
    pricer, store = AutoPricer(Settings(tau_low="auto", auto_price="tokens")), TokenStore()
    store.counters.update(learned_success_rollouts=40, learned_success_tokens=2_000)
    _refresh(pricer, store)
    assert (pricer.lengths.success, pricer.lengths.failure) == (50.0, 50.0)


def test_the_pool_model_sees_the_evidence_decayed_by_the_half_life(monkeypatch):
    real_fit = autoprice.fit_pool
    seen = []

    def recording_fit(evidence, prior):
        seen.append(evidence)
        return real_fit(evidence, prior)

    monkeypatch.setattr(autoprice, "fit_pool", recording_fit)
    pricer = AutoPricer(Settings(tau_low="auto", posterior_half_life=2.0))
    store = FakeStore()
    # 6 successes and 2 failures recorded at pool epoch 1; now the pool is at epoch 5: two
    # half-lives later, a quarter of the evidence is left
    store.posteriors = [StoredPosterior(alpha=7.0, beta=3.0, version=0, clock=1.0)]
    store.clock = 5.0
    assert _refresh(pricer, store)
    assert seen[-1] == [pytest.approx((1.5, 0.5))]
    never = AutoPricer(Settings(tau_low="auto", posterior_half_life=float("inf")))
    asyncio.run(never.refresh(store, version=0))
    assert seen[-1] == [pytest.approx((6.0, 2.0))]


def _level_settings(**over) -> Settings:
    return Settings(tau_low="auto", effective="reward", reward_tolerance=0.01, **over)


def test_under_the_reward_view_the_evidence_is_one_row_per_level_in_use_decayed():
    s = _level_settings(posterior_decay=0.5)
    pricer = AutoPricer(s, levels=3)
    posts = [StoredPosterior(alpha=3.0, beta=1.0, version=0, clock=0.0,
                             level_counts={"0": 4.0, "10": 2.0}),
             StoredPosterior()]      # nothing stored yet: no rows
    # one policy version since: the counts weigh 0.5, as the scheduler's _level_alphas has it
    rows = pricer._evidence(posts, version=1, clock=0.0)
    assert rows == [(2.0, 1.0), (1.0, 2.0), (0.0, 3.0)]


def test_under_the_reward_view_a_new_level_restarts_from_its_prior_and_refits_next():
    pricer, store = AutoPricer(_level_settings(), levels=2), FakeStore()
    assert pricer.fresh_plan().after_failures == 9   # Dirichlet(1, 1): never give up
    store.posteriors = [StoredPosterior(alpha=9.0, beta=1.0, version=0, clock=0.0,
                                        level_counts={"0": 8.0}) for _ in range(200)]
    assert _refresh(pricer, store)
    learned = pricer.fresh_plan().after_failures
    assert learned < 9            # every prompt gives one level: runs are telling
    assert not _refresh(pricer, store)               # too soon for another refit
    pricer.set_levels(3)
    assert pricer.levels == 3 and pricer.model == pricer.prior
    assert pricer.rho == pricer.prior_rho
    assert _refresh(pricer, store)                   # refits at once, with rows for 3 levels
    assert pricer.snapshot()["reward_levels"] == 3
