"""Which prompts the next groups open on, as the reference samplers draw them.

Every selection takes prompts from the epoch queue, without replacement: each pass of the pool
(an epoch, shuffled by `shuffled`) offers each prompt once. Two rules hold for all of them:

- **One group per prompt at a time.** A prompt whose newest group is still in flight (open,
  committed and filling, or ready and not yet delivered) is passed over: that group is its turn in
  this pass. `open_groups.lua` and `lease.lua` check the same atomically (`lua/_open.lua`), so
  replicas racing for one prompt open at most one group; the check here keeps the draw's count.
- **Predictive selections rank candidates, then use them up** (`dps`, `mopps`): the DPS and MoPPS
  references take lambda x B candidates from their shuffled dataloader each training step and keep
  the best B. Here a *round* draws lambda x `size` free prompts from the epoch, scores them, and
  keeps the best `size` in rank order; the rest are used up for that pass.
  - `SARA_SELECTION_RANK=version` (the references' step): one round of `batch_size` a policy
    version; openings past it within the version (groups SARA abandoned, or DS dropped, being
    replaced) take the epoch's next free prompts in order, unranked. So the selection's pressure
    is the papers' (B of lambda x B a step), not lambda x every opening: ranked per opening,
    SARA + DPS swept the pool many times a run and gave its busiest prompt 47-48 groups to DS's 9.
  - `opening`: each opening ranks lambda x the groups it needs.
  A round is this process's: replicas each keep their own, drawing disjoint candidates from the
  one epoch queue.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from ..math.selection import top_by_score
from ..settings import Settings
from ..store.codec import StoredPosterior
from ..store.store import Store

# prompts one draw may pass over as busy beyond those it asks for: a pool whose prompts are all in
# flight costs a bounded call, not a loop
BUSY_SPARE = 64
# rounds one opening may rank past its first, ranking per opening (a tiny pool runs out of
# fresh candidates, and a round of one that does gives fewer than asked)
SPARE_ROUNDS = 2

Scorer = Callable[[list[str], list[StoredPosterior], int], Awaitable[list[float]]]


def shuffled(ids: list[str], seed: int) -> list[str]:
    """A reproducible permutation of `ids` for one epoch."""
    out = list(ids)
    random.Random(seed).shuffle(out)
    return out


@dataclass
class Draw:
    """Prompts drawn free, with their posteriors (read to check them, kept for the plan), and
    how many busy ones the draw passed over."""

    pids: list[str] = field(default_factory=list)
    posts: list[StoredPosterior] = field(default_factory=list)
    busy: int = 0


@dataclass
class Round:
    """A ranked round of candidates: the best first, taken from the front."""

    version: int
    ranked: list[str] = field(default_factory=list)

    def take(self, count: int) -> list[str]:
        out, self.ranked = self.ranked[:count], self.ranked[count:]
        return out


class PromptDraws:
    """Draws prompts for one scheduler process: epoch order with busy prompts passed over, and
    for dps/mopps the ranked rounds (`score` gives each candidate's score at a version)."""

    def __init__(self, settings: Settings, store: Store, score: Scorer,
                 rng: random.Random) -> None:
        self.settings, self.store, self.score, self.rng = settings, store, score, rng
        self.round = Round(-1)
        self.busy_passed = 0   # busy prompts passed over since the store last counted them

    async def free_from_epoch(self, count: int, exclude: set[str] | frozenset = frozenset()
                              ) -> Draw:
        """Up to `count` prompts from the epoch queue whose newest group is not in flight (nor
        in `exclude`). The epoch is refilled at most once per pop, so a pool smaller than
        `count` gives fewer; busy prompts are used up for the pass, at most BUSY_SPARE of them."""
        draw, popped = Draw(), 0
        while len(draw.pids) < count and popped < count + BUSY_SPARE:
            want = min(count - len(draw.pids), count + BUSY_SPARE - popped)
            pids = await self.store.prompts.pop_epoch(want, self.settings.seed, shuffled)
            popped += len(pids)
            posts = await self.store.prompts.posteriors(pids)
            busy = await self.store.groups.busy_prompts(dict(zip(pids, posts)))
            for pid, post in zip(pids, posts):
                if pid in busy or pid in exclude or pid in draw.pids:
                    draw.busy += pid in busy
                    continue
                draw.pids.append(pid)
                draw.posts.append(post)
            if len(pids) < want:
                break
        self.busy_passed += draw.busy
        return draw

    async def ranked(self, count: int, version: int) -> list[str]:
        """The next `count` prompts of the predictive selections, best first (see the module's
        docstring): this version's round, then (rank per version) the epoch in order, or (rank
        per opening) new rounds while it runs short."""
        s = self.settings
        if self.round.version != version:
            self.round = Round(version)   # a new step: what is left of the old round is used up
            if s.selection_rank == "version":
                await self._rank_round(s.batch_size, version, set())
        out = self.round.take(count)
        if s.selection_rank == "version":
            if len(out) < count:          # the step's ranking is spent: the epoch, in order
                out += (await self.free_from_epoch(count - len(out), exclude=set(out))).pids
            return out
        for _ in range(SPARE_ROUNDS + 1):
            if len(out) >= count:
                break
            if not await self._rank_round(count - len(out), version, set(out)):
                break
            out += self.round.take(count - len(out))
        return out

    async def _rank_round(self, size: int, version: int, exclude: set[str]) -> bool:
        """Draw lambda x `size` free candidates, score them at `version` and append the best
        `size` to the round; False when the epoch gave none."""
        draw = await self.free_from_epoch(self.settings.selection_lambda * size, exclude=exclude)
        if not draw.pids:
            return False
        scores = await self.score(draw.pids, draw.posts, version)
        self.round.ranked += top_by_score(draw.pids, scores, size, self.rng)
        return True

    def give_back(self, pids: list[str], version: int) -> None:
        """Ranked prompts that did not open (flow control had no room): first in line for the next
        opening at the same version."""
        if pids and self.round.version == version:
            self.round.ranked[:0] = pids

    def take_busy_count(self) -> int:
        """Busy prompts passed over since the last call (for the store's counter)."""
        n, self.busy_passed = self.busy_passed, 0
        return n
