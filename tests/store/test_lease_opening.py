"""A lease that opens groups itself (one plan for every group: a uniform-prior run) leaves Redis
exactly as the scheduler's four calls did before it: lease, pop the epoch queue, open_groups.lua
on what was popped, a second lease, and the unopened prompts pushed back."""

from __future__ import annotations

import pytest

from sara_client.models import PromptIn
from sara_service.store.redis_client import connect
from sara_service.core.draws import shuffled
from sara_service.store.leases import Opening
from sara_service.store.store import Store

from .test_store import SARA8

pytestmark = pytest.mark.anyio

PROMPTS = [(f"p{i}", PromptIn(prompt=f"question {i}", answer=str(i))) for i in range(6)]
GIDS = ("gA", "gB", "gC", "gD", "gE")


async def _run(store: Store, ids: list[str]) -> None:
    await store.prompts.add_prompts(PROMPTS, 1.0, 1.0, 0)
    await store.runner.run("refill_epoch", dict(seen_epoch=0, prompt_ids=" ".join(ids)))
    # a group already open, with its probe queued: the lease takes those first
    await store.groups.open_groups(0.0, 100, [("g0", ids[0], SARA8)], "complete", 0, 0.5, 7)
    await store.redis.lpop(store.keys.epoch_queue)


def _read(r, key: bytes, kind: str):
    """The awaitable that reads `key`'s content by its Redis type."""
    if kind == "string":
        return r.get(key)
    if kind == "hash":
        return r.hgetall(key)
    if kind == "list":
        return r.lrange(key, 0, -1)
    if kind == "zset":
        return r.zrange(key, 0, -1, withscores=True)
    if kind == "set":
        return r.smembers(key)
    return r.xlen(key)  # the wake stream, by length: its entry ids are times


async def dump(store: Store) -> dict:
    """Every key of the namespace, by name without the namespace, with its content (the wake
    stream by length: its entry ids are times)."""
    out = {}
    r = store.redis
    async for key in r.scan_iter(match=store.keys.prefix + "*"):
        name = key.decode()[len(store.keys.prefix):]
        kind = (await r.type(key)).decode()
        out[name] = await _read(r, key, kind)
    return out


async def _fused(store: Store, want: int, target: int, gids: tuple[str, ...], floor: dict):
    opening = Opening(SARA8, "complete", 0.5, 7, gids)
    grant = await store.leases.lease_with_policy(1.0, "w", "L1", want, 50.0, 100, "vllm",
                                                 flow_target=target, opening=opening, **floor)
    return grant, [r.rollout_id for r in grant.rollouts]


async def _four_calls(store: Store, want: int, target: int, gids: tuple[str, ...], floor: dict):
    grant = await store.leases.lease_with_policy(1.0, "w", "L1", want, 50.0, 100, "vllm",
                                                 flow_target=target, **floor)
    ids = [r.rollout_id for r in grant.rollouts]
    count = min(len(gids), -(-(want - len(ids)) // SARA8.initial_issue))
    pids = await store.prompts.pop_epoch(count, 0, shuffled)
    opened = await store.groups.open_groups(1.0, target, list(zip(gids, pids, [SARA8] * len(pids))),
                                            "complete", 0, 0.5, 7, **floor)
    await store.prompts.unpop_epoch(pids[opened:])
    more = await store.leases.lease_with_policy(1.0, "w", "L1", want - len(ids), 50.0, 100, "vllm")
    return grant, ids + [r.rollout_id for r in more.rollouts]


@pytest.mark.parametrize("want, target, floor", [
    (20, 3, {}), (64, 100, {}), (6, 100, {}), (4, 100, {}),
    (20, 2, dict(floor_target=3.0, floor_ready=1)), (20, 3, dict(floor_target=3.0, floor_ready=0))])
async def test_a_lease_that_opens_groups_leaves_what_the_four_calls_left(redis_url, want, target,
                                                                         floor):
    """(20, 3): flow control stops the opening midway and a popped prompt goes back;
    (64, 100): every popped prompt opens; (6, 100): the group opened for the last two rollouts
    hands two over and queues the other two; (4, 100): the queue fills the lease, nothing opens.
    With a work floor: (20, 2) opens as (20, 3) does while no group is ready, and a floor that
    needs fewer than zero ready groups never applies."""
    client = connect(redis_url)
    try:
        fused, apart = Store(client, "fused"), Store(client, "apart")
        order = [pid for pid, _ in PROMPTS]
        for store in (fused, apart):
            await _run(store, order)
        grant, fused_ids = await _fused(fused, want, target, GIDS, floor)
        _, apart_ids = await _four_calls(apart, want, target, GIDS, floor)
        assert fused_ids == apart_ids
        assert await dump(fused) == await dump(apart)
        assert not grant.dry
    finally:
        await client.aclose()


async def test_an_epoch_that_runs_dry_is_said_so(store):
    """Two prompts left for five groups: both open, and the grant says to start the next epoch."""
    await store.prompts.add_prompts(PROMPTS[:2], 1.0, 1.0, 0)
    await store.runner.run("refill_epoch", dict(seen_epoch=0, prompt_ids="p0 p1"))
    grant, ids = await _fused(store, 64, 100, GIDS, {})
    assert grant.dry and ids == [f"{g}:{i}" for g in GIDS[:2] for i in range(4)]
    assert await store.redis.llen(store.keys.epoch_queue) == 0
