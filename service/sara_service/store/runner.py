"""One script runner per namespace, shared by the resource stores (prompts, groups, leases,
batches, policy, run): the Redis client, the namespace's key names, and every Lua script
registered once and called by name.

Each script's KEYS and ARGV are built by name from `redis_format.SCRIPTS`, so a store method
passes what it means (`now=...`, `lease=...`), never a position.
"""

from __future__ import annotations

from importlib import resources
from typing import Any, Sequence

import redis.asyncio as aioredis

from .keys import Keys
from .redis_format import SCRIPTS


def script_source(name: str) -> str:
    """A script's text as Redis runs it: the shared prelude (lua/_prelude.lua), the shared files
    its spec names (`ScriptSpec.library`), then the script."""
    lua = resources.files("sara_service.store") / "lua"
    parts = ["_prelude", *(f"_{lib}" for lib in SCRIPTS[name].library), name]
    return "".join((lua / f"{part}.lua").read_text() for part in parts)


class ScriptRunner:
    """The namespace's client, key names and registered scripts."""

    def __init__(self, client: aioredis.Redis, namespace: str) -> None:
        self.redis = client
        self.keys = Keys(namespace)
        self._scripts = {name: client.register_script(script_source(name)) for name in SCRIPTS}

    async def run(self, name: str, args: dict[str, Any], per_id: dict[str, str] | None = None,
                  more_keys: Sequence[str] = (), more_args: Sequence[Any] = ()) -> Any:
        """Run one script with its KEYS and ARGV built by name from redis_format.SCRIPTS:
        `per_id` fills the per-call keys (a lease's, a batch's), `more_keys`/`more_args` the
        variable tail."""
        spec = SCRIPTS[name]
        return await self._scripts[name](keys=spec.key_list(self.keys, more_keys, **(per_id or {})),
                                         args=spec.arg_list(more_args, **args))


class ResourceStore:
    """What every resource store holds: the shared runner, its client and its key names."""

    def __init__(self, runner: ScriptRunner) -> None:
        self.runner = runner
        self.redis: aioredis.Redis = runner.redis
        self.keys: Keys = runner.keys

