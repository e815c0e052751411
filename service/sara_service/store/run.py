"""The run as a whole in Redis: its pause/drain state, the counters and the snapshot behind
/stats and /metrics, the workers it has seen, and its stored format.

A pause or drain sticks because the scripts that open groups (open_groups.lua), lease
(lease.lua) and form batches (form_batch.lua) read the run state, so no replica can race past
it. Here: the writes that set it and the reads behind `/runs` and `/stats`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from . import redis_format as rf
from .codec import text, texts
from .errors import unavailable_on_redis_error
from .migrate import ensure_format
from .runner import ResourceStore

RUN_ACTIONS = {"pause": "paused", "drain": "draining", "resume": "running"}
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
    enabled_prompts: int | None = None  # prompts groups can open on (neither disabled nor deleted)


class RunStore(ResourceStore):
    """Run state, counters, workers and the stored format."""

    @unavailable_on_redis_error
    async def ping(self) -> bool:
        """True when Redis answers."""
        return bool(await self.redis.ping())

    async def ensure_format(self) -> str:
        """Make the stored format this release's (store/migrate.py): 'current', 'fresh' or
        'migrated'; UnknownFormat for one it does not read."""
        return await ensure_format(self)

    @unavailable_on_redis_error
    async def migrate_run_wide(self, renamed_json: str, max_int: int) -> list[int]:
        """migrate_format.lua, the migration's run-wide steps: [counters renamed, policy
        version reset, open yield written]."""
        out = await self.runner.run("migrate_format", dict(renamed=renamed_json, max_int=max_int))
        return [int(x) for x in out]

    # --- pause, drain, resume ------------------------------------------------------------------

    @unavailable_on_redis_error
    async def set_run_state(self, action: str) -> None:
        """pause | drain | resume. One key, one command: atomic without a script; the scripts
        that open groups, lease and form batches read it."""
        if action == "resume":
            await self.redis.delete(self.keys.run_state)
        else:
            await self.redis.set(self.keys.run_state, RUN_ACTIONS[action])
        if action != "pause":  # waiting leases may open groups again; a drain may deliver
            for kind in ("lease", "batch"):
                await self.redis.xadd(self.keys.wake, {"w": kind}, maxlen=64, approximate=True)

    @unavailable_on_redis_error
    async def run_state(self) -> str:
        """running | paused | draining | drained (draining with no open group, no ready group and
        no unacked batch: everything in flight was delivered and acked)."""
        k = self.keys
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(k.run_state)
        pipe.zcard(k.open_groups)
        pipe.llen(k.ready)
        pipe.zcard(k.unacked)
        state, open_n, ready_n, unacked_n = await pipe.execute()
        state = text(state) if state else "running"
        if state == "draining" and open_n == ready_n == unacked_n == 0:
            return "drained"
        return state

    # --- counters and stats --------------------------------------------------------------------

    @unavailable_on_redis_error
    async def counter_values(self, fields: tuple[str, ...]) -> dict[str, int]:
        """Integer counters from the stats hash (0 where unset)."""
        raw = await self.redis.hmget(self.keys.stats, list(fields))
        return {f: int(float(v)) if v is not None else 0 for f, v in zip(fields, raw)}

    @unavailable_on_redis_error
    async def counters(self) -> dict[str, str]:
        """The whole stats hash as text."""
        return texts(await self.redis.hgetall(self.keys.stats))

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
        pipe.hlen(k.prompts)
        pipe.hvals(k.prompts_off)
        (stats, hist, leased, open_scores, ready, unacked, workers, info,
         recent, levels, non_binary, prompts, off) = await pipe.execute()
        per_worker = rf.split_worker_info(texts(info))
        return StatsSnapshot(
            counters=texts(stats),
            abandon_hist={a: int(b) for a, b in texts(hist).items()},
            leased=leased, open_group_scores=[score for _, score in open_scores],
            ready_groups=ready, unacked_batches=unacked,
            workers=[WorkerRow(text(w), last_seen, per_worker.get(text(w), {}))
                     for w, last_seen in workers],
            recent_batches=[json.loads(r) for r in recent],
            reward_levels={a: int(b) for a, b in texts(levels).items()},
            non_binary_reward=float(non_binary) if non_binary is not None else None,
            enabled_prompts=prompts - sum(text(state) == "disabled" for state in off))

    @unavailable_on_redis_error
    async def reward_level_count(self) -> int:
        """How many reward levels the run has seen (SARA_EFFECTIVE=reward)."""
        return int(await self.redis.hlen(self.keys.reward_levels))

    @unavailable_on_redis_error
    async def note_non_binary_reward(self, reward: float) -> bool:
        """Remember the run's first reward other than 0 and 1; True when this call was first."""
        return bool(await self.redis.set(self.keys.non_binary_reward, repr(float(reward)),
                                         nx=True))

    # --- workers -------------------------------------------------------------------------------

    @unavailable_on_redis_error
    async def prune_workers(self, seen_before: float, limit: int = 200) -> int:
        """Forget workers last seen before `seen_before` (set, info, cancel list); how many."""
        return int(await self.runner.run("prune_workers",
                                         dict(seen_before=seen_before, limit=limit)))

    @unavailable_on_redis_error
    async def stop_worker(self, now: float, worker_id: str) -> bool:
        """stop_worker.lua: a worker that stopped on request shows as stopped at once; True
        when it was known."""
        return bool(await self.runner.run("stop_worker", dict(now=now, worker_id=worker_id)))

    # --- the trainer ---------------------------------------------------------------------------

    @unavailable_on_redis_error
    async def note_trainer(self, now: float) -> None:
        """A trainer asked for a batch or acked one now. One key, one command: atomic without a
        script (the last writer is the latest call, or near enough for a warning)."""
        await self.redis.set(self.keys.trainer_seen, repr(float(now)))

    @unavailable_on_redis_error
    async def batch_supply(self) -> tuple[float | None, int, int]:
        """(when the newest batch formed, None: never; groups committed; groups decided: committed,
        abandoned or completed pure), for what holds a waiting trainer up."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.lindex(self.keys.recent_batches, 0)
        pipe.hmget(self.keys.stats, ["groups_committed", "groups_abandoned",
                                     "groups_completed_pure"])
        newest, (committed, abandoned, pure) = await pipe.execute()
        formed = json.loads(newest)["created_at"] if newest else None
        committed = int(committed or 0)
        return formed, committed, committed + int(abandoned or 0) + int(pure or 0)

    async def trainer_activity(self) -> tuple[int, float | None]:
        """(groups ready, when a trainer last asked for a batch or acked one; None: never)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.llen(self.keys.ready)
        pipe.get(self.keys.trainer_seen)
        ready, seen = await pipe.execute()
        return int(ready), (float(seen) if seen is not None else None)
