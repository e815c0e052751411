"""The allocator interface, and the policies that are only a Beta-Binomial plan: uniform,
dynamic_sampling and SARA (see the package's docstring)."""

from __future__ import annotations

from typing import Any

from ...math.allocation import GroupPlan, plan_group
from ...math.reward_levels import plan_levels
from ...settings import Settings
from ...store.codec import StoredPosterior


class Allocator:
    """uniform and dynamic_sampling (and SARA's base): a Beta-Binomial plan (`math.allocation.plan_group`) under the
    policy's name: SARA's thresholds where p_eff drops below tau_low, the baselines' at k + 1."""

    prices_by_tau = False
    reads_history = False
    settings_class: type | None = None   # its own settings (strategy_settings), if it has any

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

    async def stats(self) -> dict[str, Any]:
        """What this policy adds to /stats' `strategy` (its decisions are in the counters)."""
        return {}


class Sara(Allocator):
    """SARA: the Beta-Binomial plan with its thresholds; tau_low=auto prices them."""

    prices_by_tau = True
