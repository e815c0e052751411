"""The selection interface: epoch order (every prompt drawn is opened), and the ranked
selections' base (see the package's docstring)."""

from __future__ import annotations

import random
from typing import Any

from ...settings import Settings
from ...store.codec import StoredPosterior
from ...store.store import Store
from ..draws import PromptDraws
from ..planning import Planner


class Selection:
    """epoch: the epoch queue in its shuffled order, every prompt drawn opened."""

    reads_history = False
    settings_class: type | None = None   # its own settings (strategy_settings), if it has any

    def __init__(self, settings: Settings, store: Store, planner: Planner,
                 rng: random.Random) -> None:
        self.settings, self.store, self.planner, self.rng = settings, store, planner, rng
        self.draws = PromptDraws(settings, store, self.scores, rng)

    async def draw(self, count: int) -> tuple[list[str], int]:
        """The next `count` free prompts, and the version a ranking used (-1: none)."""
        return (await self.draws.free_from_epoch(count)).pids, -1

    async def give_back(self, pids: list[str], ranked_at: int) -> None:
        """Drawn prompts that did not open go back to the front of the epoch."""
        await self.store.prompts.unpop_epoch(pids)

    async def kept(self, posts: list[StoredPosterior], version: int, clock: float
                   ) -> list[bool]:
        """Which drawn prompts open a group (all, here)."""
        return [True] * len(posts)

    async def stats(self) -> dict[str, Any]:
        """What this selection adds to /stats' `strategy` (nothing for epoch order)."""
        return {}

    async def scores(self, pids: list[str], posts: list[StoredPosterior], version: int
                     ) -> list[float]:
        """A ranking's score of each candidate (epoch order ranks nothing)."""
        raise NotImplementedError(f"SARA_SELECTION={self.settings.selection} does not rank")


class Ranked(Selection):
    """A predictive selection: rounds of lambda x B candidates ranked by `scores` (core.draws)."""

    reads_history = True

    async def draw(self, count: int) -> tuple[list[str], int]:
        version = (await self.store.policy.get_policy()).version
        return await self.draws.ranked(count, version), version

    async def give_back(self, pids: list[str], ranked_at: int) -> None:
        self.draws.give_back(pids, ranked_at)

    async def stats(self) -> dict[str, Any]:
        """This replica's ranked round: the version it was ranked at, and prompts left in it."""
        rounds = self.draws.round
        return {"ranked_at_version": rounds.version, "ranked_left": len(rounds.ranked)}
