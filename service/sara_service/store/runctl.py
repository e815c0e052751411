"""Run control in Redis: prompt listing and disabling, and the run's pause/drain state.

The checks that make these stick live in the Lua scripts that open groups (open_groups.lua: run
state and disabled prompts), lease (lease.lua: paused) and form batches (form_batch.lua: a
draining run delivers what is ready), so no replica can race past a pause. Here: the writes that
set them and the reads behind `/runs` and `GET /prompts`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import NotFound
from .redis_format import Reply
from .codec import StoredPosterior, decode_posterior, decode_prompt, text
from .errors import unavailable_on_redis_error

RUN_ACTIONS = {"pause": "paused", "drain": "draining", "resume": "running"}
PROMPT_ACTIONS = ("disable", "enable", "delete")


@dataclass
class ListedPrompt:
    prompt_id: str
    content: dict[str, Any]
    posterior: StoredPosterior
    state: str  # enabled | disabled


class RunControl:
    """Mixed into Store: needs `redis`, `keys` and `_script`."""

    redis: Any
    keys: Any

    async def _script(self, name: str, args: dict[str, Any]) -> Any:  # pragma: no cover
        raise NotImplementedError

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
        out = text(await self._script("prompt_state", dict(action=action, prompt_id=pid)))
        if out == Reply.UNKNOWN:
            raise NotFound("unknown_prompt", f"no prompt with id {pid!r}")
        return out

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
