"""DPS as a selection (SARA_SELECTION=dps): its transition model is math/selection.py."""

from __future__ import annotations

from ...math.selection import DpsParams, dps_mixed_probability, dps_observations
from ...store.codec import StoredPosterior
from ...strategy_settings import DpsSettings
from .base import Ranked


class Dps(Ranked):
    """dps: each candidate's predicted P(mixed) at this version (DPS's transition model)."""

    settings_class = DpsSettings

    async def scores(self, pids: list[str], posts: list[StoredPosterior], version: int
                     ) -> list[float]:
        s = self.settings
        params = DpsParams(decay=s.dps_decay, prior=s.dps_prior)
        return [dps_mixed_probability(dps_observations(p.observations, s.dps_censored),
                                      version, params) for p in posts]
