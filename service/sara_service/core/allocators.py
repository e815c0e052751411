"""Allocation policies: how a group of one prompt is planned, committed and delivered.

An allocator is the part of a policy that runs in Python; what a result does to a group's state
runs atomically in Redis, in the policy's Lua library (`store/lua/_policy_<name>.lua`, dispatched
by `apply_results.lua` on the plan's fields). The scheduler knows only this interface:

- `fixed_plan(levels)`: every group's plan under a uniform prior (None levels: the outcome view;
  a count: the reward view's Dirichlet over that many levels);
- `plan_for(a, b)`: the plan of a prompt whose posterior is Beta(a, b) (SARA_PRIOR=history);
- `commit`: how a committed group is filled ('complete': to k, 'partial': what is issued);
- `excludes(post)`: a prompt this policy does not sample again (reads its history when
  `reads_history`);
- `delivered(results)`: a group's results as the trainer gets them;
- `prices_by_tau`: whether tau_low=auto prices its plans (SARA only: the baselines ignore τ).

The pure math each one calls lives in `math/` (allocation, reinforce_ada, pilot_commit).
"""

from __future__ import annotations

import json

from ..math.allocation import GroupPlan, plan_group
from ..math.pilot_commit import excluded, pilot_band, plan_pilot
from ..math.reinforce_ada import keep_slots, plan_rounds, round_rule
from ..math.reward_levels import plan_levels
from ..math.selection import greso_streak
from ..settings import Settings
from ..store.codec import StoredPosterior


class Allocator:
    """uniform and dynamic_sampling (and SARA's base): a Beta-Binomial plan (`math.allocation.plan_group`) under the
    policy's name: SARA's thresholds where p_eff drops below tau_low, the baselines' at k + 1."""

    prices_by_tau = False
    reads_history = False

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.name = settings.policy

    def fixed_plan(self, levels: int | None) -> GroupPlan:
        """The plan of every group under a uniform prior and a fixed tau_low."""
        s = self.settings
        if levels is not None:
            return plan_levels(self.name, s.group_size, levels, s.prior_alpha, float(s.tau_low))
        return self.plan_for(s.prior_alpha, s.prior_beta)

    def plan_for(self, a: float, b: float) -> GroupPlan:
        """The plan of one prompt whose posterior is Beta(a, b) now."""
        s = self.settings
        return plan_group(self.name, s.group_size, a, b, s.tau_low, tau_fail=s.tau_low_fail)

    @property
    def commit(self) -> str:
        """How committed groups are filled: as SARA_COMMIT says."""
        return self.settings.commit

    def excludes(self, post: StoredPosterior) -> bool:
        """Whether the prompt is not sampled again (never, here)."""
        return False

    def delivered(self, results: list[bytes]) -> tuple[list[bytes], list[float] | None]:
        """A group's results as delivered, and every reward it drew when those are fewer."""
        return results, None


class Sara(Allocator):
    """SARA: the Beta-Binomial plan with its thresholds; tau_low=auto prices them."""

    prices_by_tau = True


class ReinforceAda(Allocator):
    """Reinforce-Ada: rounds of SARA_ADA_ROUND until its rule's outcomes are in
    (`math.reinforce_ada`); delivered as it stands, down-sampled to SARA_ADA_KEEP."""

    def fixed_plan(self, levels: int | None) -> GroupPlan:
        s = self.settings
        return plan_rounds(s.group_size, s.prior_alpha, s.prior_beta,
                           round_rule(s.ada_round, s.ada_keep, s.ada_rule))

    @property
    def commit(self) -> str:
        return "partial"   # each group stops at the end of a round

    def delivered(self, results: list[bytes]) -> tuple[list[bytes], list[float] | None]:
        s = self.settings
        rewards = [float(json.loads(raw)["reward"]) for raw in results]
        kept = keep_slots([r >= s.success_threshold for r in rewards], s.ada_keep)
        return [results[i] for i in kept], (rewards if len(kept) < len(results) else None)


class PilotCommit(Allocator):
    """Pilot-Commit: a pilot of SARA_PC_PILOT decides the group (`math.pilot_commit`); a
    committed one is filled to k, and a prompt whose last pilot was solved can be excluded."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.reads_history = settings.pc_exclude_solved

    def fixed_plan(self, levels: int | None) -> GroupPlan:
        s = self.settings
        return plan_pilot(s.group_size, s.prior_alpha, s.prior_beta,
                          pilot_band(s.pc_pilot, s.pc_band_low, s.pc_band_high), s.pc_tau_low)

    @property
    def commit(self) -> str:
        return "complete"   # its commit is the group's budget

    def excludes(self, post: StoredPosterior) -> bool:
        return self.settings.pc_exclude_solved and excluded(*greso_streak(post.observations))


ALLOCATORS: dict[str, type[Allocator]] = {
    "uniform": Allocator, "dynamic_sampling": Allocator, "sara": Sara,
    "reinforce_ada": ReinforceAda, "pilot_commit": PilotCommit,
}


def allocator_for(settings: Settings) -> Allocator:
    """The run's allocation policy (SARA_POLICY)."""
    return ALLOCATORS[settings.policy](settings)
