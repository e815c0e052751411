"""The prompt pool in Redis: registering prompts, the epoch queue, posteriors, the listing behind
`GET /prompts`, and disabling or deleting a prompt.

Disabling sticks because the scripts that open groups (open_groups.lua, lease.lua) read the
disabled set, so no replica can open a group on a prompt another just disabled.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Callable

from sara_client.models import PromptIn, prompt_json

from . import redis_format as rf
from ..errors import NotFound
from .codec import StoredPosterior, decode_posterior, decode_prompt, shared_prompt, text
from .errors import unavailable_on_redis_error
from .redis_format import Reply
from .runner import ResourceStore, ScriptRunner

PROMPT_ACTIONS = ("disable", "enable", "delete")


@dataclass
class ListedPrompt:
    prompt_id: str
    content: dict[str, Any]
    posterior: StoredPosterior
    state: str  # enabled | disabled


class PromptStore(ResourceStore):
    """Prompts, their posteriors and the epoch queue."""

    def __init__(self, runner: ScriptRunner) -> None:
        super().__init__(runner)
        # one epoch refill at a time per process: when the queue runs dry, every lease in flight
        # finds it short at once, and each reading and shuffling the whole pool cost more than
        # the leases themselves (replicas still refill once between them: refill_epoch.lua)
        self._refill_lock = asyncio.Lock()

    @unavailable_on_redis_error
    async def add_prompts(self, prompts: list[tuple[str, PromptIn]], alpha0: float,
                          beta0: float, version: int) -> tuple[int, list[str]]:
        """Register prompts (id, content); returns (how many were new, ids already stored with
        other content, which was kept)."""
        initial = json.dumps(rf.initial_posterior(alpha0, beta0, version))
        contents = [(pid, dict(zip(rf.PROMPT_FIELDS, (prompt_json(p.prompt), p.answer, p.task,
                                                      p.meta)))) for pid, p in prompts]
        pairs = [x for pid, content in contents for x in (pid, json.dumps(content))]
        created, maybe = await self.runner.run("add_prompts", dict(initial_posterior=initial),
                                               more_args=pairs)
        maybe = list(dict.fromkeys(text(x) for x in maybe))
        stored = dict(zip(maybe, await self.redis.hmget(self.keys.prompts, maybe) if maybe else []))
        return int(created), [pid for pid in maybe if stored[pid] is None or any(
            json.loads(stored[pid]) != content for other, content in contents if other == pid)]

    # --- the epoch queue -------------------------------------------------------------------------

    @unavailable_on_redis_error
    async def pop_epoch(self, count: int, seed: int,
                        shuffle: Callable[[list[str], int], list[str]]) -> list[str]:
        """Up to `count` prompt ids from the epoch queue, starting a new epoch when it runs dry."""
        got = await self._lpop_epoch(count)
        if len(got) < count:  # at most one refill per call: a tiny pool gives fewer than asked
            async with self._refill_lock:
                got += await self._lpop_epoch(count - len(got))  # refilled while we waited?
                if len(got) < count and await self._refill_epoch(seed, shuffle):
                    got += await self._lpop_epoch(count - len(got))
        return got

    async def _lpop_epoch(self, count: int) -> list[str]:
        return [text(x) for x in (await self.redis.lpop(self.keys.epoch_queue, count) or [])]

    async def _refill_epoch(self, seed: int,
                            shuffle: Callable[[list[str], int], list[str]]) -> bool:
        """Queue the next epoch (unless another replica just did); False when the pool is empty."""
        k = self.keys
        epoch = int(await self.redis.get(k.epoch) or 0)
        ids = sorted(text(x) for x in await self.redis.hkeys(k.prompts))
        if not ids:
            return False
        order = shuffle(ids, seed * 1_000_003 + epoch)
        await self.runner.run("refill_epoch", dict(seen_epoch=epoch, prompt_ids=" ".join(order)))
        return True

    @unavailable_on_redis_error
    async def unpop_epoch(self, pids: list[str]) -> None:
        """Give back prompt ids that were popped but not opened (front of the queue, in order)."""
        if pids:
            await self.redis.lpush(self.keys.epoch_queue, *reversed(pids))

    # --- reads -----------------------------------------------------------------------------------

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
    async def enabled_count(self) -> int:
        """Prompts groups can open on: registered and not disabled (deleted ones are gone)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hlen(self.keys.prompts)
        pipe.hvals(self.keys.prompts_off)
        registered, off = await pipe.execute()
        return registered - sum(text(state) == "disabled" for state in off)

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

    # --- listing and state -----------------------------------------------------------------------

    @unavailable_on_redis_error
    async def list_prompts(self, cursor: int, count: int) -> tuple[int, list[ListedPrompt]]:
        """One page of prompts by HSCAN: (next cursor, 0 when done; the page). Like any SCAN, a
        prompt added or removed meanwhile may be missed or listed twice, never lost for good."""
        k = self.keys
        nxt, page = await self.redis.hscan(k.prompts, cursor, count=count)
        pids = [text(p) for p in page]
        if not pids:
            return int(nxt), []
        pipe = self.redis.pipeline(transaction=False)
        pipe.hmget(k.posteriors, pids)
        pipe.hmget(k.prompts_off, pids)
        posts, off = await pipe.execute()
        return int(nxt), [ListedPrompt(pid, decode_prompt(page[raw_pid]), decode_posterior(post),
                                       text(state) if state else "enabled")
                          for pid, raw_pid, post, state in zip(pids, page, posts, off)]

    @unavailable_on_redis_error
    async def prompt_state(self, pid: str) -> str:
        """'enabled' | 'disabled' of a registered prompt (NotFound otherwise)."""
        if not await self.redis.hexists(self.keys.prompts, pid):
            raise NotFound("unknown_prompt", f"no prompt with id {pid!r}")
        state = await self.redis.hget(self.keys.prompts_off, pid)
        return text(state) if state else "enabled"

    @unavailable_on_redis_error
    async def set_prompt_state(self, action: str, pid: str) -> str:
        """Disable, enable or delete a prompt; returns its state now. NotFound if unknown."""
        out = text(await self.runner.run("prompt_state", dict(action=action, prompt_id=pid)))
        if out == Reply.UNKNOWN:
            raise NotFound("unknown_prompt", f"no prompt with id {pid!r}")
        return out
