"""The store's reads: prompts and posteriors, groups and slots, batches, the policy, and the
snapshot behind /stats and /metrics. Plain reads need no script: each is one command or one
pipelined round trip, and what it reads is decoded here (formats: redis_format)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from sara_client.models import PolicyInfo

from . import redis_format as rf
from ..errors import NotFound
from .codec import (StoredPosterior, decode_posterior, decode_prompt, decode_result, shared_prompt,
                    stored_int, text)
from .errors import unavailable_on_redis_error

RECENT_BATCHES_SHOWN = 20


@dataclass
class WorkerRow:
    worker_id: str
    last_seen: float
    info: dict[str, str] = field(default_factory=dict)  # redis_format.WORKER_INFO_FIELDS


@dataclass
class StatsSnapshot:
    """What /stats shows, read in one round trip."""

    counters: dict[str, str]  # the stats hash
    abandon_hist: dict[str, int]  # rollouts done at abandonment -> groups
    leased: int
    open_group_scores: list[float]  # expected yield of each open group
    ready_groups: int
    unacked_batches: int
    workers: list[WorkerRow]
    recent_batches: list[dict[str, Any]]  # newest first
    reward_levels: dict[str, int] = field(default_factory=dict)  # level -> rollouts (reward view)
    non_binary_reward: float | None = None  # the first reward not 0/1 (outcome view's warning)


def _texts(raw: dict) -> dict[str, str]:
    return {text(a): text(b) for a, b in raw.items()}


class StoreReads:
    """Mixed into Store: needs `redis`, `keys` and Store's `_script` (a read that runs as one
    script)."""

    redis: Any
    keys: Any
    _script: Any

    @unavailable_on_redis_error
    async def get_prompt(self, pid: str) -> tuple[dict[str, Any], StoredPosterior]:
        """(content, posterior) of one prompt; NotFound if unknown."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hget(self.keys.prompts, pid)
        pipe.hget(self.keys.posteriors, pid)
        content, posterior = await pipe.execute()
        if content is None:
            raise NotFound("unknown_prompt", f"no prompt with id {pid!r}")
        return decode_prompt(content), decode_posterior(posterior)

    @unavailable_on_redis_error
    async def posteriors(self, pids: list[str]) -> list[StoredPosterior]:
        """The posterior of each prompt id (``StoredPosterior()`` where none is stored)."""
        if not pids:
            return []
        raw = await self.redis.hmget(self.keys.posteriors, pids)
        return [decode_posterior(r) for r in raw]

    @unavailable_on_redis_error
    async def pool_clock(self) -> float:
        """Epochs of the pool so far: prompts consumed (groups opened + prompts skipped) per
        prompt, the clock posterior half-lives run on (apply_results.lua computes the same).
        Adding prompts slows it; it never runs backwards for a posterior (each keeps its max)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hlen(self.keys.prompts)
        pipe.hmget(self.keys.stats, ["groups_opened", "groups_skipped"])
        n, (opened, skipped) = await pipe.execute()
        return (int(opened or 0) + int(skipped or 0)) / n if n else 0.0

    @unavailable_on_redis_error
    async def sample_posteriors(self, limit: int) -> list[StoredPosterior]:
        """Every prompt's posterior when there are at most `limit`, else `limit` at random."""
        key = self.keys.posteriors
        if await self.redis.hlen(key) <= limit:
            raw = list((await self.redis.hgetall(key)).values())
        else:
            pairs = await self.redis.hrandfield(key, limit, withvalues=True) or []
            raw = pairs[1::2]
        return [decode_posterior(r) for r in raw]

    @unavailable_on_redis_error
    async def random_prompts(self, count: int) -> list[str]:
        """Up to `count` distinct prompt ids drawn uniformly (a candidate pool for dps/mopps)."""
        return [text(x) for x in await self.redis.hrandfield(self.keys.prompts, count) or []]

    @unavailable_on_redis_error
    async def read_prompts(self, pids: list[str]) -> list[dict[str, Any] | None]:
        """Prompt content of each id (None where unknown)."""
        if not pids:
            return []
        raw = await self.redis.hmget(self.keys.prompts, pids)
        if any(r is None for r in raw):  # a deleted prompt's groups in flight still deliver
            retired = await self.redis.hmget(self.keys.prompts_retired, pids)
            raw = [r if r is not None else old for r, old in zip(raw, retired)]
        return [shared_prompt(r) if r else None for r in raw]  # callers only read them

    # --- counters ------------------------------------------------------------------------------

    @unavailable_on_redis_error
    async def counter_values(self, fields: tuple[str, ...]) -> dict[str, int]:
        """Integer counters from the stats hash (0 where unset)."""
        raw = await self.redis.hmget(self.keys.stats, list(fields))
        return {f: int(float(v)) if v is not None else 0 for f, v in zip(fields, raw)}

    @unavailable_on_redis_error
    async def counters(self) -> dict[str, str]:
        """The whole stats hash as text."""
        return _texts(await self.redis.hgetall(self.keys.stats))

    @unavailable_on_redis_error
    async def stats_snapshot(self) -> StatsSnapshot:
        """Counters, queues, workers and recent batches in one pipelined round trip."""
        k = self.keys
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(k.stats)
        pipe.hgetall(k.abandon_hist)
        pipe.zcard(k.inflight)
        pipe.zrange(k.open_groups, 0, -1, withscores=True)
        pipe.llen(k.ready)
        pipe.zcard(k.unacked)
        pipe.zrange(k.workers, 0, -1, withscores=True)
        pipe.hgetall(k.worker_info)
        pipe.lrange(k.recent_batches, 0, RECENT_BATCHES_SHOWN - 1)
        pipe.hgetall(k.reward_levels)
        pipe.get(k.non_binary_reward)
        (stats, hist, leased, open_scores, ready, unacked, workers, info,
         recent, levels, non_binary) = await pipe.execute()
        per_worker = rf.split_worker_info(_texts(info))
        return StatsSnapshot(
            counters=_texts(stats),
            abandon_hist={a: int(b) for a, b in _texts(hist).items()},
            leased=leased, open_group_scores=[score for _, score in open_scores],
            ready_groups=ready, unacked_batches=unacked,
            workers=[WorkerRow(text(w), last_seen, per_worker.get(text(w), {}))
                     for w, last_seen in workers],
            recent_batches=[json.loads(r) for r in recent],
            reward_levels={a: int(b) for a, b in _texts(levels).items()},
            non_binary_reward=float(non_binary) if non_binary is not None else None)

    @unavailable_on_redis_error
    async def reward_level_count(self) -> int:
        """How many reward levels the run has seen (SARA_EFFECTIVE=reward)."""
        return int(await self.redis.hlen(self.keys.reward_levels))

    @unavailable_on_redis_error
    async def note_non_binary_reward(self, reward: float) -> bool:
        """Remember the run's first reward other than 0 and 1; True when this call was first."""
        return bool(await self.redis.set(self.keys.non_binary_reward, repr(float(reward)),
                                         nx=True))

    # --- groups, slots, batches, policy --------------------------------------------------------

    @unavailable_on_redis_error
    async def read_groups(self, group_ids: list[str]) -> list[dict[str, str]]:
        """Raw hash of each group (empty dict for a group that no longer exists); fields:
        redis_format.GroupField."""
        pipe = self.redis.pipeline(transaction=False)
        for gid in group_ids:
            pipe.hgetall(self.keys.group(gid))
        return [_texts(row) for row in await pipe.execute()]

    @unavailable_on_redis_error
    async def read_group_results(self, group_ids: list[str], k: int,
                                 decode: Callable[[bytes], Any] = decode_result
                                 ) -> list[tuple[str, list[Any]]]:
        """(prompt id, results in slot order) per group: only what a batch carries. `decode`
        turns a stored result's JSON into what the caller wants (default: a dict)."""
        if not group_ids:
            return []
        rows = await self._script("group_results", dict(k=k),
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
    async def slot_states(self, rollout_ids: list[str]) -> list[rf.Slot]:
        """Decoded slot state of each rollout id (kind 'unissued' where there is none)."""
        if not rollout_ids:
            return []
        raw = await self.redis.hmget(self.keys.slots, rollout_ids)
        return [rf.decode_slot(text(r) if r else None) for r in raw]

    @unavailable_on_redis_error
    async def all_slots(self) -> dict[str, rf.Slot]:
        """Every slot of the namespace, decoded (for checks that count them; HGETALL)."""
        raw = await self.redis.hgetall(self.keys.slots)
        return {rid: rf.decode_slot(st) for rid, st in _texts(raw).items()}

    @unavailable_on_redis_error
    async def read_batch(self, batch_id: str) -> dict[str, str]:
        """The batch hash; NotFound when it does not exist."""
        raw = await self.redis.hgetall(self.keys.batch(batch_id))
        if not raw:
            raise NotFound("unknown_batch", f"no batch with id {batch_id!r}")
        return _texts(raw)

    @unavailable_on_redis_error
    async def get_policy(self) -> PolicyInfo:
        """The current policy version and checkpoint (version 0 before any publish)."""
        raw = await self.redis.hmget(self.keys.policy, ["version", "checkpoint"])
        checkpoint = text(raw[1]) if raw[1] else None
        return PolicyInfo(version=stored_int(raw[0]), checkpoint=checkpoint or None)
