"""Prompt selections: which prompts the next groups open on (SARA_SELECTION).

Every selection draws from the epoch queue without replacement and passes over prompts with a
group in flight (`draws.PromptDraws`). What differs is behind this interface:

- `draw(count)`: the next prompts, and the policy version a ranking used (-1: epoch order);
- `give_back(pids, ranked_at)`: prompts drawn that flow control had no room to open;
- `kept(posts, version, clock)`: a filter before any rollout (history, GRESO); skipped prompts
  count as `groups_skipped`;
- `scores(pids, posts, version)`: a ranking's score per candidate (dps, mopps);
- `reads_history`: whether choosing reads the prompts' posteriors (then the lease script cannot
  open groups on its own: see `Scheduler._opening`).

The pure rules (DPS's transition model, MoPPS's Thompson score, GRESO's keep chance) live in
`math/selection.py`.
"""

from __future__ import annotations

import random

from ..math.selection import (
    DpsParams, GresoParams, dps_mixed_probability, dps_observations, greso_keep_chance,
    greso_streak, mopps_levels_score, mopps_score,
)
from ..settings import Settings
from ..store.codec import StoredPosterior
from ..store.store import Store
from .draws import PromptDraws
from .planning import Planner


class Selection:
    """epoch: the epoch queue in its shuffled order, every prompt drawn opened."""

    reads_history = False

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

    async def scores(self, pids: list[str], posts: list[StoredPosterior], version: int
                     ) -> list[float]:
        """A ranking's score of each candidate (epoch order ranks nothing)."""
        raise NotImplementedError(f"SARA_SELECTION={self.settings.selection} does not rank")


class History(Selection):
    """history: skip a prompt whose chance of a mixed group is below SARA_TAU_SKIP now."""

    reads_history = True

    async def kept(self, posts: list[StoredPosterior], version: int, clock: float
                   ) -> list[bool]:
        tau = self.settings.tau_skip
        return [self.planner.start_chance(post, version, clock) >= tau for post in posts]


class Greso(Selection):
    """GRESO's pre-rollout filter, prompt by prompt: kept with chance max(p^c, floor) after c
    zero-variance groups in a row (selection.greso_keep_chance); the rates adapt once per policy
    version, from the pool's second epoch on, as GRESO's do from its second."""

    reads_history = True

    def __init__(self, settings: Settings, store: Store, planner: Planner,
                 rng: random.Random) -> None:
        super().__init__(settings, store, planner, rng)
        s = settings
        self.params = GresoParams(target=s.greso_target, p_start=s.greso_p_start,
                                  p_min=s.greso_p_min, p_max=s.greso_p_max, step=s.greso_step)

    async def kept(self, posts: list[StoredPosterior], version: int, clock: float
                   ) -> list[bool]:
        p_easy, p_hard = await self.store.policy.greso_rates(version, clock >= 1.0, self.params)
        return [self.rng.random() < greso_keep_chance(*greso_streak(post.observations),
                                                      p_easy, p_hard, self.params)
                for post in posts]


class Ranked(Selection):
    """A predictive selection: rounds of lambda x B candidates ranked by `scores` (core.draws)."""

    reads_history = True

    async def draw(self, count: int) -> tuple[list[str], int]:
        version = (await self.store.policy.get_policy()).version
        return await self.draws.ranked(count, version), version

    async def give_back(self, pids: list[str], ranked_at: int) -> None:
        self.draws.give_back(pids, ranked_at)


class Dps(Ranked):
    """dps: each candidate's predicted P(mixed) at this version (DPS's transition model)."""

    async def scores(self, pids: list[str], posts: list[StoredPosterior], version: int
                     ) -> list[float]:
        s = self.settings
        params = DpsParams(decay=s.dps_decay, prior=s.dps_prior)
        return [dps_mixed_probability(dps_observations(p.observations, s.dps_censored),
                                      version, params) for p in posts]


class Mopps(Ranked):
    """mopps: a Thompson sample of each candidate's posterior, scored by its closeness to
    SARA_MOPPS_TARGET (under the reward view, its Dirichlet's chance of a mixed group)."""

    async def scores(self, pids: list[str], posts: list[StoredPosterior], version: int
                     ) -> list[float]:
        s, planner = self.settings, self.planner
        clock = await self.store.prompts.pool_clock()
        if planner.reward_view:
            return [mopps_levels_score(planner.level_alphas(p, version, clock), s.group_size,
                                       self.rng) for p in posts]
        return [mopps_score(*planner.posterior_now(p, version, clock), self.rng, s.mopps_target)
                for p in posts]


SELECTIONS: dict[str, type[Selection]] = {
    "epoch": Selection, "history": History, "greso": Greso, "dps": Dps, "mopps": Mopps,
}


def selection_for(settings: Settings, store: Store, planner: Planner,
                  rng: random.Random) -> Selection:
    """The run's prompt selection (SARA_SELECTION)."""
    return SELECTIONS[settings.selection](settings, store, planner, rng)
