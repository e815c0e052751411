"""The stored format's version, and the one migration that brings an unversioned namespace to it.

A namespace records the format it is written in (`Keys.format_version`). A scheduler checks it
when it starts (`ensure_format`): the current version is served as it is; none at all is either a
fresh namespace, which gets the version, or one written before versions existed, which
`migrate` moves forward once; any other version is refused, so a release never serves data it
was not written to read.

Format 1 differs from the unversioned format in what the door now refuses and the scripts now
keep, each of which a reader used to tolerate on every read:
- a counter under its earlier name (RENAMED_COUNTERS) is added to its new one;
- a policy version past 2**53 (inf, NaN: 10**400 was once let in) starts again from 0;
- the open groups' expected yield is one running total, not summed on first use;
- an open group's p_eff tables are JSON lists, not a field per entry (pf:<n>, ps:<n>);
- a logprob stored as null (it was -inf or NaN) is FLOOR_LOGPROB;
- a prompt's meta that cannot be serialised (too deep, a lone surrogate, NaN) is a note.
The run-wide steps are one script (lua/migrate_format.lua); the per-prompt and per-group repairs
are single-field writes, each idempotent, so a migration cut short is run again from the start.
A lock makes replicas that start together migrate once; the version is written last.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable, Protocol

import redis.asyncio as aioredis

from sara_client.limits import FLOOR_LOGPROB, MAX_STORED_INT, meta_problem

from .codec import text
from .errors import unavailable_on_redis_error
from .keys import Keys
from .redis_format import FORMAT_VERSION

# counters an unversioned namespace kept under an earlier name
RENAMED_COUNTERS = {"rollouts_saved_vs_ds": "rollouts_not_spent_on_abandoned_groups"}
LOCK_TTL_S = 300
SCAN_COUNT = 500


class FormatStore(Protocol):
    """What the check and the migration use of the run store (run.RunStore)."""

    redis: aioredis.Redis
    keys: Keys

    async def migrate_run_wide(self, renamed_json: str, max_int: int) -> list[int]: ...


class UnknownFormat(RuntimeError):
    """The namespace is written in a format this release does not read."""


@unavailable_on_redis_error
async def ensure_format(store: FormatStore, wait_s: float = LOCK_TTL_S,
                        sleep: Callable[[float], Any] = asyncio.sleep) -> str:
    """Make the namespace's stored format this release's: 'current' when it already is,
    'fresh' for an empty namespace, 'migrated' when it was moved forward. UnknownFormat for a
    format this release does not know (a newer release wrote it)."""
    redis, keys = store.redis, store.keys
    stored = await redis.get(keys.format_version)
    if stored is not None:
        return _check(text(stored))
    if not await redis.exists(keys.stats, keys.prompts, keys.policy):
        # NX: should another replica have written the version meanwhile, its version stands
        if await redis.set(keys.format_version, FORMAT_VERSION, nx=True):
            return "fresh"
        return _check(text(await redis.get(keys.format_version)))
    lock = keys.format_version + ":migrating"
    waited = 0.0
    while not await redis.set(lock, "1", nx=True, ex=LOCK_TTL_S):
        stored = await redis.get(keys.format_version)   # another replica is migrating
        if stored is not None:
            return _check(text(stored))
        if waited >= wait_s:
            raise UnknownFormat(f"another scheduler has held {lock} for {wait_s:.0f} s without "
                                "finishing the format migration; delete the key to take over")
        await sleep(0.5)
        waited += 0.5
    try:
        stored = await redis.get(keys.format_version)   # a replica finished before we locked
        if stored is not None:
            return _check(text(stored))
        await migrate(store)
        await redis.set(keys.format_version, FORMAT_VERSION)
    finally:
        await redis.delete(lock)
    return "migrated"


def _check(stored: str) -> str:
    if stored != str(FORMAT_VERSION):
        raise UnknownFormat(f"this namespace is written in stored format {stored}; this release "
                            f"reads format {FORMAT_VERSION}: run the release that wrote it, or "
                            "start a new run in another SARA_NAMESPACE")
    return "current"


async def migrate(store: FormatStore) -> dict[str, int]:
    """Move an unversioned namespace to format 1; returns how much each step changed."""
    keys = store.keys
    moved, reset, written = await store.migrate_run_wide(json.dumps(RENAMED_COUNTERS),
                                                         MAX_STORED_INT)
    prompts = 0
    for key in (keys.prompts, keys.prompts_retired):
        prompts += await _rewrite_fields(store.redis, key, repaired_prompt)
    tables, results = 0, 0
    async for gid in _scan_fields(store.redis, keys.group_states):
        group = store.redis, keys.group(gid)
        tables += await _join_tables(*group)
        results += await _rewrite_fields(*group, repaired_result, match="r:*")
    return {"counters_renamed": int(moved), "policy_version_reset": int(reset),
            "open_yield_written": int(written), "prompts_repaired": prompts,
            "groups_tables_joined": tables, "results_repaired": results}


def repaired_prompt(raw: str) -> str | None:
    """A stored prompt with its unserialisable meta replaced by a note; None when it is fine."""
    content = json.loads(raw)
    problem = meta_problem(content.get("meta"))
    if not problem:
        return None
    content["meta"] = {"sara_note": f"meta dropped: it {problem}; register the prompt again "
                                    "under a new id"}
    return json.dumps(content)


def repaired_result(raw: str) -> str | None:
    """A stored result with its null logprobs as FLOOR_LOGPROB; None when it has none."""
    result = json.loads(raw)
    logprobs = result.get("logprobs") or []
    if None not in logprobs:
        return None
    result["logprobs"] = [FLOOR_LOGPROB if x is None else x for x in logprobs]
    return json.dumps(result)


async def _scan_fields(redis: Any, key: str):
    """Every field name of a hash, by HSCAN."""
    async for field, _ in redis.hscan_iter(key, count=SCAN_COUNT):
        yield text(field)


async def _rewrite_fields(redis: Any, key: str, repair: Callable[[str], str | None],
                          match: str | None = None) -> int:
    """Write back every field of a hash that `repair` changes; returns how many."""
    changed = 0
    async for field, raw in redis.hscan_iter(key, match=match, count=SCAN_COUNT):
        fixed = repair(text(raw))
        if fixed is not None:
            await redis.hset(key, field, fixed)
            changed += 1
    return changed


async def _join_tables(redis: Any, key: str) -> int:
    """An open group's p_eff tables, kept as one field per entry, as the two JSON lists the
    scripts read; returns 1 when it joined them."""
    fields = {text(f): text(v) for f, v in (await redis.hgetall(key)).items()}
    if "pf" in fields or "pf:0" not in fields:
        return 0
    joined = {}
    for side in ("pf", "ps"):
        entries = sorted((int(f.split(":")[1]), float(v)) for f, v in fields.items()
                         if f.startswith(side + ":"))
        joined[side] = "[" + ",".join(repr(x) for _, x in entries) + "]"
    await redis.hset(key, mapping=joined)
    await redis.hdel(key, *[f for f in fields if f.startswith(("pf:", "ps:"))])
    return 1
