"""Run control in Redis: prompt listing and disabling, and the run's pause/drain state.

The checks that make these stick live in the Lua scripts that open groups (open_groups.lua: run
state and disabled prompts), lease (lease.lua: paused) and form batches (form_batch.lua: a
draining run delivers what is ready), so no replica can race past a pause. Here: the writes that
set them and the reads behind `/runs` and `GET /prompts`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .errors import NotFound
from .store_codec import _s, decode_prompt
from .store_errors import _unavailable_on_redis_error

RUN_ACTIONS = {"pause": "paused", "drain": "draining", "resume": "running"}
PROMPT_ACTIONS = ("disable", "enable", "delete")


@dataclass
class ListedPrompt:
    prompt_id: str
    content: dict[str, Any]
    posterior: dict[str, Any]
    state: str  # enabled | disabled


class RunControl:
    """Mixed into Store: needs `redis`, `keys` and `_run`."""

    redis: Any
    keys: Any

    async def _run(self, name: str, keys: list[str], args: list[Any]) -> Any:  # pragma: no cover
        raise NotImplementedError

    @_unavailable_on_redis_error
    async def list_prompts(self, cursor: int, count: int) -> tuple[int, list[ListedPrompt]]:
        """One page of prompts by HSCAN: (next cursor, 0 when done; the page). Like any SCAN, a
        prompt added or removed meanwhile may be missed or listed twice, never lost for good."""
        k = self.keys
        nxt, page = await self.redis.hscan(k.prompts, cursor, count=count)
        pids = [_s(p) for p in page]
        if not pids:
            return int(nxt), []
        pipe = self.redis.pipeline(transaction=False)
        pipe.hmget(k.posteriors, pids)
        pipe.hmget(k.prompts_off, pids)
        posts, off = await pipe.execute()
        return int(nxt), [ListedPrompt(pid, decode_prompt(page[raw_pid]), json.loads(post or "{}"),
                                       _s(state) if state else "enabled")
                          for pid, raw_pid, post, state in zip(pids, page, posts, off)]

    @_unavailable_on_redis_error
    async def prompt_state(self, pid: str) -> str:
        """'enabled' | 'disabled' of a registered prompt (NotFound otherwise)."""
        if not await self.redis.hexists(self.keys.prompts, pid):
            raise NotFound("unknown_prompt", f"no prompt with id {pid!r}")
        state = await self.redis.hget(self.keys.prompts_off, pid)
        return _s(state) if state else "enabled"

    @_unavailable_on_redis_error
    async def set_prompt_state(self, action: str, pid: str) -> str:
        """Disable, enable or delete a prompt; returns its state now. NotFound if unknown."""
        k = self.keys
        out = _s(await self._run("prompt_state", [k.prompts, k.posteriors, k.prompts_off,
                                                  k.prompts_retired], [action, pid]))
        if out == "unknown":
            raise NotFound("unknown_prompt", f"no prompt with id {pid!r}")
        return out

    @_unavailable_on_redis_error
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

    @_unavailable_on_redis_error
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
        state = _s(state) if state else "running"
        if state == "draining" and open_n == ready_n == unacked_n == 0:
            return "drained"
        return state
