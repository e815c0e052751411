"""The price and pool model behind ``tau_low = "auto"``: what the scheduler feeds the pure math.

`sara_service.math.autotau` needs two things it cannot know from settings: ρ, the rollouts one
effective group costs in this pool now, and the pool's distribution of success rates. Both are
re-derived here every `auto_refit_groups` decided groups (sooner early in a run), from what the
store already holds:

- the pool model: EM over the prompts' learned posteriors (decayed as the scheduler decays them,
  so it follows a moving pool at the pace the posteriors do);
- ρ: rollouts completed per committed group over the last few refits (a window, so it follows
  the pool), shrunk toward the model's own fixed-point price with the weight of `SHRINK`
  effective groups. The model's price is derived from every prompt's evidence and is nearly
  free of noise; a window of a few hundred groups is not (its ratio wanders by several
  percent, enough to flip a threshold back and forth near a step of the plan), so the live
  figure gets an equal say only once its window holds SHRINK effective groups. It is there to
  correct the model where the model's shape misfits the pool. (bench/allocation.py, 2,048
  groups, two seeds: weights from 64 to model-only differ by less than the seed-to-seed
  spread, about 1%.)

Under ``auto_price = "tokens"`` the same is done in tokens: a rollout costs the mean completion
tokens of a success or of a failure (`autotau.TokenLengths`), from the learned_* counters the
results script keeps once per slot (`apply_results.lua`), over the same window of refits (the
whole run until the window holds `MIN_LENGTH_SAMPLES` of each; `settings.max_tokens` for both
before any, which prices every rollout alike: the rollout plan). ρ is then tokens generated per
committed group, shrunk toward the model's fixed point in tokens.

Under ``SARA_EFFECTIVE=reward`` (`levels` set) the pool model is one of level chances: each
prompt gives one row per level in use (its decayed rollouts at the level, and elsewhere;
`autotau.level_evidence`), the prior is the symmetric Dirichlet's marginal, and the plan is
`autotau.level_thresholds`'s one threshold for every level. When the run sees a new level
(`set_levels`) the prior and the price start again from L + 1 and the next refresh refits.

Each replica keeps its own copy; replicas of one namespace read the same counters and
posteriors, so they agree up to when each last refitted. Plans are cached per ρ rounded to 0.1
rollouts (in tokens: to a tenth of a mean rollout): the plan is a step function of ρ, and finer
changes rarely move a threshold.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from ..math.allocation import GroupPlan, decay_posterior, decay_weight, plan_group
from ..math.autotau import (PoolModel, TokenLengths, fit_pool, fixed_point_rho, level_evidence,
                            level_pool_prior)
from ..math.reward_levels import plan_levels_auto
from ..store.codec import StoredPosterior
from ..settings import Settings
from ..store.store import Store

SHRINK = 256.0         # effective groups' worth of weight on the model's price
WINDOW = 3             # refits the live price looks back over
EVIDENCE_LIMIT = 4096  # prompts read per refit (all of them in a smaller pool)
MIN_LENGTH_SAMPLES = 32  # rollouts of each outcome a window needs to give the mean lengths
ROLLOUT_COUNTERS = ("rollouts_completed", "groups_committed", "groups_abandoned",
                    "groups_dropped_saturated")
TOKEN_COUNTERS = ("tokens_generated", "learned_success_rollouts", "learned_success_tokens",
                  "learned_failure_rollouts", "learned_failure_tokens")


class AutoPricer:
    """ρ and the pool model in force under tau_low=auto, and the plans they give."""

    def __init__(self, settings: Settings, levels: int | None = None) -> None:
        """`levels`: the reward levels in use under SARA_EFFECTIVE=reward; None: the outcome
        view's pool of success rates."""
        s = settings
        self.settings = s
        self.fill = s.commit == "complete"
        self.tokens = s.auto_price == "tokens"
        # before any rollout is seen, every rollout is priced alike: the rollout plan, in tokens
        self.lengths = TokenLengths(s.max_tokens, s.max_tokens) if self.tokens else None
        self.live_rho: float | None = None
        self.refits = 0
        self._fitted_at: int | None = None
        self._window: deque[dict[str, int]] = deque(maxlen=WINDOW + 1)
        self._plans: dict[float, GroupPlan] = {}
        self.levels = levels
        self._start_from_prior()

    def _start_from_prior(self) -> None:
        """The model and price before anything is learned (again after a new level is seen)."""
        s = self.settings
        if self.levels is None:
            self.prior = PoolModel.beta(s.prior_alpha, s.prior_beta)
        else:
            self.prior = level_pool_prior(s.prior_alpha, self.levels)
        self.model = self.prior
        self.prior_rho = fixed_point_rho(self.prior, s.group_size, self.fill, s.tau_floor,
                                         lengths=self.lengths, levels=self.levels)
        self.model_rho = self.prior_rho
        self.set_price(self.prior_rho)

    def set_levels(self, levels: int) -> None:
        """The reward view saw a new level: plan for `levels` from the prior again, and refit at
        the next refresh (the fitted model has no rows for the new level)."""
        if self.levels is None or levels == self.levels:
            return
        self.levels = levels
        self._fitted_at = None
        self._start_from_prior()

    def set_price(self, rho: float) -> None:
        """Put a price in force (the refit does this; tests inject one)."""
        self.rho = rho
        self._plans.clear()

    def price_key(self) -> float:
        """The price plans are derived at: ρ rounded to 0.1 rollouts (under tokens, to a tenth
        of a mean rollout), so a plan is cached per step rather than per tiny change."""
        if self.lengths is None:
            return round(self.rho, 1)
        quantum = (self.lengths.success + self.lengths.failure) / 20
        return round(self.rho / quantum) * quantum

    def fresh_plan(self) -> GroupPlan:
        """The plan of a prompt with no evidence of its own: one per rounded ρ."""
        key = self.price_key()
        plan = self._plans.get(key)
        if plan is None:
            s = self.settings
            if self.levels is not None:
                plan = plan_levels_auto(s.group_size, self.levels, self.model, key, self.fill,
                                        s.tau_floor)
            else:
                plan = plan_group("sara", s.group_size, s.prior_alpha, s.prior_beta, "auto",
                                  rho=key, tau_floor=s.tau_floor, pool=self.model,
                                  fill=self.fill, lengths=self.lengths)
            self._plans[key] = plan
        return plan

    def plan_for(self, alpha: float, beta: float) -> GroupPlan:
        """The plan of a prompt whose (decayed) posterior is Beta(alpha, beta): the pool model
        reweighted by its evidence; such a plan may skip the prompt."""
        s = self.settings
        model = self.model.given(alpha - s.prior_alpha, beta - s.prior_beta)
        return plan_group("sara", s.group_size, alpha, beta, "auto", rho=self.price_key(),
                          tau_floor=s.tau_floor, pool=model, fill=self.fill, allow_skip=True,
                          lengths=self.lengths)

    async def refresh(self, store: Store, version: int) -> bool:
        """Refit the pool model and the price if enough groups were decided since the last
        refit; True when it refitted."""
        c = await store.run.counter_values(
            ROLLOUT_COUNTERS + (TOKEN_COUNTERS if self.tokens else ()))
        decided = c["groups_committed"] + c["groups_abandoned"] + c["groups_dropped_saturated"]
        if self._fitted_at is not None and decided - self._fitted_at < self._interval():
            return False
        self._fitted_at = decided
        evidence = self._evidence(await store.prompts.sample_posteriors(EVIDENCE_LIMIT), version,
                                  await store.prompts.pool_clock())
        # EM over a few thousand prompts takes up to ~1 s of pure Python: off the event loop,
        # so leases and results keep being served meanwhile (the GIL still shares the CPU)
        self.model = await asyncio.to_thread(fit_pool, evidence, self.prior)
        self._window.append(c)
        if self.tokens:
            self.lengths = self._window_lengths()
        s = self.settings
        self.model_rho = fixed_point_rho(self.model, s.group_size, self.fill, s.tau_floor,
                                         lengths=self.lengths, levels=self.levels)
        spent_field = "tokens_generated" if self.tokens else "rollouts_completed"
        spent = self._window[-1][spent_field] - self._window[0][spent_field]
        effective = self._window[-1]["groups_committed"] - self._window[0]["groups_committed"]
        self.live_rho = spent / effective if effective else None
        self.refits += 1
        self.set_price((spent + SHRINK * self.model_rho) / (effective + SHRINK))
        return True

    def _window_lengths(self) -> TokenLengths:
        # the window's means follow lengths that drift as the policy trains; until it holds
        # enough of each outcome, the whole run's; with no outcome of a kind, the other's
        first, last = self._window[0], self._window[-1]
        means = {}
        for side in ("success", "failure"):
            n_field, t_field = f"learned_{side}_rollouts", f"learned_{side}_tokens"
            n, tokens = last[n_field] - first[n_field], last[t_field] - first[t_field]
            if n < MIN_LENGTH_SAMPLES:
                n, tokens = last[n_field], last[t_field]
            # at least one token: an empty completion still costs a rollout's overhead
            means[side] = max(1.0, tokens / n) if n else None
        fallback = means["success"] or means["failure"] or float(self.settings.max_tokens)
        return TokenLengths(means["success"] or fallback, means["failure"] or fallback)

    def _interval(self) -> int:
        # early on, refit each time the decided count doubles (16, 32, 64, ...): the first
        # groups teach the most, and the prior plan they run under is the least informed
        assert self._fitted_at is not None
        return min(self.settings.auto_refit_groups, max(16, self._fitted_at))

    def _evidence(self, posteriors: list[StoredPosterior], version: int, clock: float
                  ) -> list[tuple[float, float]]:
        """Each posterior's evidence decayed to now, as the scheduler decays it when it plans a
        group: per policy version since `version`'s and by the half-life in epochs of the pool
        since its `clock` reading (store.pool_clock). Under the reward view, its level rows."""
        s = self.settings
        out: list[tuple[float, float]] = []
        for post in posteriors:
            if not post.has_evidence:
                continue
            versions, epochs = post.age(version, clock)
            if self.levels is not None:
                weight = decay_weight(s.posterior_decay, versions, s.posterior_half_life, epochs)
                counts = [weight * c for c in post.level_counts.values()]
                out += level_evidence(counts, self.levels) if counts else []
                continue
            a, b = decay_posterior(post.alpha, post.beta, s.prior_alpha, s.prior_beta,
                                   s.posterior_decay, versions, s.posterior_half_life, epochs)
            out.append((a - s.prior_alpha, b - s.prior_beta))
        return out

    def snapshot(self) -> dict[str, Any]:
        """What /stats shows: the price in force, where it came from, and the fresh plan."""
        plan = self.fresh_plan()
        lengths = self.lengths
        return {"rho": self.rho, "rho_live_window": self.live_rho, "rho_model": self.model_rho,
                "rho_prior": self.prior_rho, "refits": self.refits,
                "price": self.settings.auto_price,
                "tokens_success": lengths.success if lengths else None,
                "tokens_failure": lengths.failure if lengths else None,
                "pool_mean_success": self.model.mean(),
                "reward_levels": self.levels,
                "abandon_after_failures": plan.after_failures,
                "abandon_after_successes": plan.after_successes,
                "tau_floor": self.settings.tau_floor}
