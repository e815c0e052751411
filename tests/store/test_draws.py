"""core/draws.py on a real Redis: candidates come from the epoch without replacement, a round
keeps the best 1 in lambda and uses the rest up, rounds follow the policy version (or each
opening), and busy prompts are passed over."""

from __future__ import annotations

import random

import pytest

from sara_client.models import PromptIn
from sara_service.core.draws import PromptDraws
from sara_service.math.allocation import plan_group
from sara_service.settings import Settings

pytestmark = pytest.mark.anyio

POOL = 40
SARA8 = plan_group("sara", 8, 1.0, 1.0, 0.5)


def by_number(pids, posts, version):
    """Scores that rank prompt "p<n>" by n, highest first (a stand-in for DPS and MoPPS)."""
    async def scored():
        return [float(pid[1:]) for pid in pids]
    return scored()


async def _draws(store, **settings) -> PromptDraws:
    await store.prompts.add_prompts([(f"p{i}", PromptIn(prompt=str(i))) for i in range(POOL)],
                                    1.0, 1.0, 0)
    await store.redis.hdel(store.keys.prompts, "p")   # the fixture's own prompt: not in the pool
    s = Settings(selection="dps", batch_size=4, **settings)
    return PromptDraws(s, store, by_number, random.Random(0))


async def test_a_round_keeps_the_best_of_lambda_b_and_uses_the_rest_up(store):
    draws = await _draws(store, selection_lambda=2)
    first = await draws.ranked(4, version=0)
    queue = await store.redis.lrange(store.keys.epoch_queue, 0, -1)
    assert len(queue) == POOL - 8                    # lambda x B = 8 candidates left the epoch
    popped = {f"p{i}" for i in range(POOL)} - {q.decode() for q in queue}
    assert first == sorted(popped, key=lambda p: -int(p[1:]))[:4]
    # the step's ranking is spent: the next opening at the same version takes the epoch's next
    # prompts in order, unranked
    second = await draws.ranked(4, version=0)
    assert second == [q.decode() for q in queue[:4]]
    assert await store.redis.llen(store.keys.epoch_queue) == POOL - 12
    # the next version ranks a new round
    third = await draws.ranked(4, version=1)
    assert third == sorted(third, key=lambda p: -int(p[1:]))
    assert await store.redis.llen(store.keys.epoch_queue) == POOL - 20


async def test_a_new_version_starts_a_new_round_and_drops_the_old_ones_rest(store):
    draws = await _draws(store, selection_lambda=2)
    first = await draws.ranked(2, version=0)          # half the round taken
    rest = draws.round.ranked[:]
    assert len(rest) == 2
    later = await draws.ranked(2, version=1)
    assert not set(later) & set(rest) and not set(later) & set(first)
    # what flow control did not open goes back first in line, at the same version only
    left = draws.round.ranked[:]
    draws.give_back(later, version=1)
    assert draws.round.ranked == later + left
    assert await draws.ranked(2, version=1) == later
    draws.give_back(later, version=0)                 # ranked at another version: dropped
    assert draws.round.ranked == left


async def test_per_opening_ranks_lambda_times_what_the_opening_needs(store):
    draws = await _draws(store, selection_lambda=3, selection_rank="opening")
    got = await draws.ranked(2, version=0)
    assert len(got) == 2
    assert len(await store.redis.lrange(store.keys.epoch_queue, 0, -1)) == POOL - 6
    again = await draws.ranked(2, version=0)           # every opening ranks its own round
    assert again == sorted(again, key=lambda p: -int(p[1:]))
    assert len(await store.redis.lrange(store.keys.epoch_queue, 0, -1)) == POOL - 12


async def test_every_prompt_is_offered_once_a_pass(store):
    draws = await _draws(store, selection_lambda=2)
    chosen = []
    for version in range(5):                          # 5 rounds of 8: one pass of 40
        chosen += await draws.ranked(4, version)
    assert len(chosen) == len(set(chosen)) == 20
    assert await store.redis.llen(store.keys.epoch_queue) == 0


async def test_busy_prompts_are_passed_over_and_counted(store):
    draws = await _draws(store, selection_lambda=1)
    await store.runner.run("refill_epoch", dict(
        seen_epoch=0, prompt_ids=" ".join(f"p{i}" for i in range(POOL))))
    await store.groups.open_groups(0.0, 100, [("g0", "p0", SARA8), ("g1", "p1", SARA8)],
                                   "complete")
    draw = await draws.free_from_epoch(3)
    assert draw.pids == ["p2", "p3", "p4"] and draw.busy == 2
    assert draws.take_busy_count() == 2 and draws.take_busy_count() == 0
