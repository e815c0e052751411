"""Plans for new groups: a prompt's posterior now, and the plan its allocator makes from it.

One `Planner` per scheduler process. It holds what plans are derived from and what changes
during a run:

- the reward levels in use (SARA_EFFECTIVE=reward): plans are the Dirichlet's over them, and the
  set grows as the run sees new levels (`refresh_levels`);
- the price under tau_low=auto (`autoprice`): plans follow the pool's yield (`refresh_price`);
- `prior_plan`: with a uniform prior every group of a run has one plan, computed once (under
  auto, once per price).

Under SARA_PRIOR=history each prompt's plan is its own posterior's, decayed to now
(`posterior_now`); under the reward view, its own Dirichlet's (`plan_levels_history`).
"""

from __future__ import annotations

from ..math.allocation import GroupPlan, decay_posterior, decay_weight, p_eff
from ..math.reward_levels import levels_in_use, p_eff_levels, plan_levels_history
from ..settings import Settings
from ..store.codec import StoredPosterior
from ..store.store import Store
from .allocators import Allocator
from .autoprice import AutoPricer


class Planner:
    """The plans of one process's new groups (see the module's docstring)."""

    def __init__(self, settings: Settings, allocator: Allocator) -> None:
        s = self.settings = settings
        self.allocator = allocator
        self.reward_view = s.effective == "reward"
        self.levels = levels_in_use(s.reward_levels, 0)
        # the baselines ignore τ, so they keep the fixed plan under auto
        self.auto = (AutoPricer(s, self.levels if self.reward_view else None)
                     if s.tau_low == "auto" and allocator.prices_by_tau else None)
        self.prior_plan = self._fresh_plan()

    def _fresh_plan(self) -> GroupPlan:
        if self.auto is not None:
            return self.auto.fresh_plan()
        return self.allocator.fixed_plan(self.levels if self.reward_view else None)

    async def refresh_levels(self, store: Store) -> None:
        """Under the reward view, plan for every level the run has seen (the set only grows):
        one more level makes a pure prefix less telling, so groups are abandoned later. It is
        one round trip: called when a report brings a level this process has not seen, by the
        upkeep loop (levels other replicas saw) and before opening groups, never on a lease."""
        if not self.reward_view:
            return
        levels = levels_in_use(self.settings.reward_levels, await store.run.reward_level_count())
        if levels != self.levels:
            self.levels = levels
            if self.auto is not None:
                self.auto.set_levels(levels)
            self.prior_plan = self._fresh_plan()

    async def refresh_price(self, store: Store) -> None:
        """Under tau_low=auto, refit the price to the pool's yield and re-plan."""
        if self.auto is not None:
            await self.auto.refresh(store, (await store.policy.get_policy()).version)
            self.prior_plan = self.auto.fresh_plan()

    def posterior_now(self, post: StoredPosterior, version: int, clock: float
                      ) -> tuple[float, float]:
        """The posterior decayed to now: `version` and the pool's `clock` (store.pool_clock)."""
        s = self.settings
        if not post.has_evidence:
            return s.prior_alpha, s.prior_beta
        versions, epochs = post.age(version, clock)
        return decay_posterior(post.alpha, post.beta, s.prior_alpha, s.prior_beta,
                               s.posterior_decay, versions, s.posterior_half_life, epochs)

    def start_chance(self, post: StoredPosterior, version: int, clock: float) -> float:
        """P(a new group of the prompt comes out effective): its Beta p_eff, or under the reward
        view its Dirichlet's (see :meth:`level_alphas`)."""
        s = self.settings
        if not self.reward_view:
            return p_eff(0, 0, s.group_size, *self.posterior_now(post, version, clock))
        alphas = self.level_alphas(post, version, clock)
        return p_eff_levels([0] * len(alphas), s.group_size, alphas)

    def level_counts(self, post: StoredPosterior, version: int, clock: float
                     ) -> dict[str, float]:
        """The prompt's rollouts per reward level, decayed to now as a and b are."""
        s = self.settings
        versions, epochs = post.age(version, clock)
        weight = decay_weight(s.posterior_decay, versions, s.posterior_half_life, epochs)
        return {level: weight * c for level, c in post.level_counts.items()}

    def level_alphas(self, post: StoredPosterior, version: int, clock: float) -> list[float]:
        """The prompt's Dirichlet over reward levels now: alpha0 per level in use plus its level
        counts, decayed to now as a and b are."""
        s = self.settings
        alphas = [s.prior_alpha + c for c in self.level_counts(post, version, clock).values()]
        return alphas + [s.prior_alpha] * max(0, self.levels - len(alphas))

    def plan_of(self, post: StoredPosterior, version: int, clock: float) -> GroupPlan:
        """The plan of one prompt: the run's plan under a uniform prior, else its own
        posterior's (under the reward view its Dirichlet's, a threshold per level it has
        produced)."""
        s = self.settings
        if s.prior == "uniform":
            return self.prior_plan
        if self.reward_view:
            return plan_levels_history(self.allocator.name, s.group_size,
                                       self.level_counts(post, version, clock), self.levels,
                                       s.prior_alpha, float(s.tau_low))
        a, b = self.posterior_now(post, version, clock)
        if self.auto is not None:
            return self.auto.plan_for(a, b)
        return self.allocator.plan_for(a, b)
