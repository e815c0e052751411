"""history: skip a prompt whose chance of a mixed group is low now (SARA_TAU_SKIP)."""

from __future__ import annotations

from ...store.codec import StoredPosterior
from .base import Selection


class History(Selection):
    """history: skip a prompt whose chance of a mixed group is below SARA_TAU_SKIP now."""

    reads_history = True

    async def kept(self, posts: list[StoredPosterior], version: int, clock: float
                   ) -> list[bool]:
        tau = self.settings.tau_skip
        return [self.planner.start_chance(post, version, clock) >= tau for post in posts]
