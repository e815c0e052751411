"""Group sizings: how many prompts an opening draws, and each group's size (SARA_GROUP_SIZING).

- `draw_count(rollouts_wanted, per_group, flow_target)`: prompts to draw for a lease;
- `plans(drawn, version, clock)`: (prompt id, plan) for the drawn prompts, and how many were
  not opened (a plan that skips its prompt);
- `reads_history`: whether sizing reads the prompts' posteriors;
- `stats()`: what it adds to /stats' `strategy`.
"""

from __future__ import annotations

import math
from typing import Any

from ..math.allocation import GroupPlan
from ..math.knapsack import KnapsackParams, estimated_rate, sized_plan, split_budget
from ..math.selection import greso_streak
from ..settings import Settings
from ..store.codec import StoredPosterior
from ..strategy_settings import VarKSettings
from .planning import Planner

Planned = list[tuple[str, GroupPlan]]


class FixedSizing:
    """fixed: k for every group, each prompt planned by its allocator."""

    reads_history = False
    settings_class: type | None = None   # its own settings (strategy_settings), if it has any

    def __init__(self, settings: Settings, planner: Planner) -> None:
        self.settings, self.planner = settings, planner

    async def stats(self) -> dict[str, Any]:
        """What this sizing adds to /stats' `strategy` (nothing: group sizes show in batches)."""
        return {}

    def draw_count(self, rollouts_wanted: int, per_group: int, flow_target: int) -> int:
        """Enough groups for the rollouts wanted, at most flow control's target."""
        return min(flow_target, math.ceil(rollouts_wanted / per_group))

    def plans(self, drawn: list[tuple[str, StoredPosterior]], version: int, clock: float
              ) -> tuple[Planned, int]:
        """Each prompt's plan; one whose plan skips it (SARA_PRIOR=history) is not opened."""
        chosen, skipped = [], 0
        for pid, post in drawn:
            plan = self.planner.plan_of(post, version, clock)
            if plan.skip:
                skipped += 1
                continue
            chosen.append((pid, plan))
        return chosen, skipped


class VarK(FixedSizing):
    """var_k: the draw's budget of k per prompt split by expected value (math.knapsack), each
    prompt planned for its own size. A size whose SARA plan would skip the prompt runs whole
    instead: the split chose the prompt."""

    reads_history = True
    settings_class = VarKSettings

    def __init__(self, settings: Settings, planner: Planner) -> None:
        super().__init__(settings, planner)
        s = settings
        self.knapsack = KnapsackParams(min_n=s.vk_min, max_n=s.vk_max, confidence=s.vk_confidence)

    def draw_count(self, rollouts_wanted: int, per_group: int, flow_target: int) -> int:
        return self.settings.vk_batch   # the split needs its whole draw

    def plans(self, drawn: list[tuple[str, StoredPosterior]], version: int, clock: float
              ) -> tuple[Planned, int]:
        s = self.settings
        if not drawn:
            return [], 0
        posteriors = [self.planner.posterior_now(post, version, clock) for _, post in drawn]
        rates = [estimated_rate(greso_streak(post.observations)[0] if post.observations
                                else None, a - s.prior_alpha, b - s.prior_beta)
                 for (_, post), (a, b) in zip(drawn, posteriors)]
        sizes = split_budget(rates, s.group_size, self.knapsack)
        plans = []
        for (pid, _), (a, b), size in zip(drawn, posteriors, sizes):
            if s.prior == "uniform":
                a, b = s.prior_alpha, s.prior_beta
            plans.append((pid, sized_plan(s.policy, size, a, b, s.tau_low)))
        return plans, 0


SIZINGS: dict[str, type[FixedSizing]] = {"fixed": FixedSizing, "var_k": VarK}


def sizing_for(settings: Settings, planner: Planner) -> FixedSizing:
    """The run's group sizing (SARA_GROUP_SIZING)."""
    return SIZINGS[settings.group_sizing](settings, planner)
