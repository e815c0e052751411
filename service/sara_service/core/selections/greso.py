"""GRESO as a selection (SARA_SELECTION=greso); its rates step in store/lua/greso_step.lua."""

from __future__ import annotations

import random
from typing import Any

from ...math.selection import GresoParams, greso_keep_chance, greso_streak
from ...settings import Settings
from ...store.codec import StoredPosterior
from ...store.store import Store
from ...strategy_settings import GresoSettings
from ..planning import Planner
from .base import Selection


class Greso(Selection):
    """GRESO's pre-rollout filter, prompt by prompt: kept with chance max(p^c, floor) after c
    zero-variance groups in a row (selection.greso_keep_chance); the rates adapt once per policy
    version, from the pool's second epoch on, as GRESO's do from its second."""

    reads_history = True
    settings_class = GresoSettings

    def __init__(self, settings: Settings, store: Store, planner: Planner,
                 rng: random.Random) -> None:
        super().__init__(settings, store, planner, rng)
        s = settings
        self.params = GresoParams(target=s.greso_target, p_start=s.greso_p_start,
                                  p_min=s.greso_p_min, p_max=s.greso_p_max, step=s.greso_step)

    async def stats(self) -> dict[str, Any]:
        """GRESO's exploration rates in force (shared by every replica, in Redis)."""
        return await self.store.policy.greso_state()

    async def kept(self, posts: list[StoredPosterior], version: int, clock: float
                   ) -> list[bool]:
        p_easy, p_hard = await self.store.policy.greso_rates(version, clock >= 1.0, self.params)
        return [self.rng.random() < greso_keep_chance(*greso_streak(post.observations),
                                                      p_easy, p_hard, self.params)
                for post in posts]
