"""MoPPS as a selection (SARA_SELECTION=mopps): its score is math/selection.py's."""

from __future__ import annotations

from ...math.selection import mopps_levels_score, mopps_score
from ...store.codec import StoredPosterior
from ...strategy_settings import MoppsSettings
from .base import Ranked


class Mopps(Ranked):
    """mopps: a Thompson sample of each candidate's posterior, scored by its closeness to
    SARA_MOPPS_TARGET (under the reward view, its Dirichlet's chance of a mixed group)."""

    settings_class = MoppsSettings

    async def scores(self, pids: list[str], posts: list[StoredPosterior], version: int
                     ) -> list[float]:
        s, planner = self.settings, self.planner
        clock = await self.store.prompts.pool_clock()
        if planner.reward_view:
            return [mopps_levels_score(planner.level_alphas(p, version, clock), s.group_size,
                                       self.rng) for p in posts]
        return [mopps_score(*planner.posterior_now(p, version, clock), self.rng, s.mopps_target)
                for p in posts]
