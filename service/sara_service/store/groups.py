"""Groups in Redis: opening them under flow control, reading them back, and deleting finished
ones once their retention runs out. A group's rollouts, once opened, move through the lease
store (leases.py); its results are read here for the batch that carries them."""

from __future__ import annotations

from typing import Any, Callable

import orjson

from . import redis_format as rf
from ..math.allocation import GroupPlan
from .codec import StoredPosterior, decode_result, text, texts
from .errors import unavailable_on_redis_error
from .keys import rollout_id
from .redis_format import GroupField
from .runner import ResourceStore


class GroupStore(ResourceStore):
    """Groups: open, read, collect."""

    @unavailable_on_redis_error
    async def open_groups(self, now: float, flow_target: int,
                          groups: list[tuple[str, str, GroupPlan]], commit: str,
                          skipped: int = 0, audit_fraction: float = 0.0, seed: int = 0, *,
                          floor_target: float = 0.0, floor_ready: int = 0,
                          skipped_busy: int = 0) -> int:
        """Open (group id, prompt id, plan) in order while flow control allows; returns how many
        were consumed (opened, or passed over as disabled, deleted or busy: a prompt with a group
        still in flight): 0 while paused or draining. While fewer than `floor_ready` groups are
        ready, the target is `floor_target` instead (the work floor, for a lease that found too
        little work; 0: none). `skipped_busy` counts the busy prompts the caller's draw passed
        over (prompts_skipped_busy).

        About `audit_fraction` of them (chosen by a hash of seed, prompt and visit) run on to k
        where SARA would abandon them, so the run measures what abandoning loses.
        """
        specs = [rf.group_spec(gid, pid, plan, commit) for gid, pid, plan in groups]
        args = dict(now=now, flow_target=flow_target, specs=orjson.dumps(specs), skipped=skipped,
                    audit_fraction=repr(float(audit_fraction)), seed=seed,
                    floor_target=repr(float(floor_target)), floor_ready=floor_ready,
                    skipped_busy=skipped_busy)
        return int(await self.runner.run("open_groups", args, more_keys=[
            self.keys.group(gid) for gid, _, _ in groups]))

    @unavailable_on_redis_error
    async def read_groups(self, group_ids: list[str]) -> list[dict[str, str]]:
        """Raw hash of each group (empty dict for a group that no longer exists); fields:
        redis_format.GroupField."""
        pipe = self.redis.pipeline(transaction=False)
        for gid in group_ids:
            pipe.hgetall(self.keys.group(gid))
        return [texts(row) for row in await pipe.execute()]

    @unavailable_on_redis_error
    async def read_group_results(self, group_ids: list[str], k: int,
                                 decode: Callable[[bytes], Any] = decode_result
                                 ) -> list[tuple[str, list[Any]]]:
        """(prompt id, results in slot order) per group: only what a batch carries. `decode`
        turns a stored result's JSON into what the caller wants (default: a dict)."""
        if not group_ids:
            return []
        rows = await self.runner.run("group_results", dict(k=k),
                                     more_keys=[self.keys.group(gid) for gid in group_ids])
        return [(text(row[0] or b""), [decode(r) for r in row[1:] if r is not None])
                for row in rows]

    @unavailable_on_redis_error
    async def group_state(self, group_ids: list[str]) -> list[str | None]:
        """Lifecycle state of each group (None where unknown): redis_format.GROUP_STATES."""
        if not group_ids:
            return []
        raw = await self.redis.hmget(self.keys.group_states, group_ids)
        return [text(r) if r else None for r in raw]

    @unavailable_on_redis_error
    async def busy_prompts(self, posts: dict[str, StoredPosterior]) -> set[str]:
        """The prompts (of `posts`, prompt id -> its posterior) whose newest group is still in
        flight (redis_format.BUSY_GROUP_STATES): no group may open on them now."""
        lasts = {post.last_group: pid for pid, post in posts.items() if post.last_group}
        if not lasts:
            return set()
        states = await self.group_state(list(lasts))
        return {lasts[gid] for gid, state in zip(lasts, states)
                if state in rf.BUSY_GROUP_STATES}

    @unavailable_on_redis_error
    async def collect_garbage(self, now: float, limit: int = 200) -> int:
        """Delete finished groups whose retention ran out; returns how many."""
        k = self.keys
        due = [text(g) for g in await self.redis.zrangebyscore(k.gc, "-inf", now, 0, limit)]
        if not due:
            return 0
        pipe = self.redis.pipeline(transaction=False)
        for gid in due:
            pipe.hget(k.group(gid), GroupField.issued)
        issued = await pipe.execute()
        # one command per key for the whole round, not five per group
        slots = [rollout_id(gid, i) for gid, n in zip(due, issued) for i in range(int(n or 0))]
        pipe = self.redis.pipeline(transaction=False)
        if slots:
            pipe.hdel(k.slots, *slots)
        pipe.delete(*(k.group(gid) for gid in due))
        pipe.hdel(k.group_states, *due)
        pipe.hdel(k.group_prompt, *due)
        pipe.zrem(k.gc, *due)
        await pipe.execute()
        return len(due)
