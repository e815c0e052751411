"""The stored format's version and its one migration (store/migrate.py), on a real Redis and a
real Redis Cluster: a fresh namespace gets the version, an unversioned one is moved forward once
(and again changes nothing), an unknown one is refused before anything is served."""

from __future__ import annotations

import json

import pytest

from sara_client.limits import FLOOR_LOGPROB
from sara_client.models import PromptIn
from sara_service.http.app import create_app
from sara_service.settings import Settings
from sara_service.store.migrate import RENAMED_COUNTERS, UnknownFormat, ensure_format
from sara_service.store.redis_client import connect
from sara_service.store.redis_format import FORMAT_VERSION
from sara_service.store.store import Store

from .test_store import SARA8, counters, report

pytestmark = pytest.mark.anyio
OLD, NEW = next(iter(RENAMED_COUNTERS.items()))


@pytest.fixture
async def empty(redis_url):
    client = connect(redis_url)
    try:
        yield Store(client, "empty")
    finally:
        await client.aclose()


async def test_a_fresh_namespace_gets_the_version_and_then_is_current(empty):
    assert await empty.run.ensure_format() == "fresh"
    assert int(await empty.redis.get(empty.keys.format_version)) == FORMAT_VERSION
    assert await empty.run.ensure_format() == "current"


async def test_a_format_this_release_does_not_read_is_refused(empty):
    await empty.redis.set(empty.keys.format_version, FORMAT_VERSION + 1)
    with pytest.raises(UnknownFormat, match=f"format {FORMAT_VERSION + 1}.*SARA_NAMESPACE"):
        await empty.run.ensure_format()


async def _unversioned(store) -> None:
    """The store's namespace as written before formats were versioned: a renamed counter, a
    policy version no publish could pass, a prompt with unserialisable meta (live and deleted),
    and a stored result with a null logprob."""
    k = store.keys
    await store.groups.open_groups(0.0, 100, [("g", "p", SARA8)], "complete")
    await report(store, "w", [("g:0", 1), ("g:1", 0)])   # mixed: committed, kept open to k
    blob = json.loads(await store.redis.hget(k.group("g"), "r:0"))
    await store.redis.hset(k.group("g"), "r:0", json.dumps({**blob, "logprobs": [-0.5, None]}))
    deep: dict = {}
    for _ in range(300):
        deep = {"a": deep}
    for key in (k.prompts, k.prompts_retired):
        await store.redis.hset(key, "bad", json.dumps({"prompt": "q", "meta": deep}))
    await store.redis.hset(k.stats, mapping={OLD: 5, NEW: 2})
    await store.redis.hset(k.policy, "version", "inf")
    await store.redis.delete(k.format_version)


async def test_an_unversioned_namespace_is_migrated_once(store):
    await _unversioned(store)
    assert await store.run.ensure_format() == "migrated"
    k = store.keys
    c = await counters(store)
    assert c[NEW] == 7 and OLD not in c
    assert (await store.policy.get_policy()).version == 0
    assert (await store.policy.publish_policy(1.0, 1, None)).version == 1
    for key in (k.prompts, k.prompts_retired):
        meta = json.loads(await store.redis.hget(key, "bad"))["meta"]
        assert set(meta) == {"sara_note"} and "nested" in meta["sara_note"]
    result = json.loads(await store.redis.hget(k.group("g"), "r:0"))
    assert result["logprobs"] == [-0.5, FLOOR_LOGPROB]
    assert int(await store.redis.get(k.format_version)) == FORMAT_VERSION
    # run again (a migration cut short before writing its version is run from the start)
    before = {key: await store.redis.hgetall(key) for key in (k.stats, k.prompts, k.group("g"))}
    await store.redis.delete(k.format_version)
    assert await store.run.ensure_format() == "migrated"
    assert {key: await store.redis.hgetall(key) for key in before} == before


async def test_a_replica_waits_for_the_one_that_holds_the_migration_lock(store):
    await store.redis.set(store.keys.format_version + ":migrating", "1")
    naps = []

    async def other_replica_finishes(seconds: float) -> None:
        naps.append(seconds)
        await store.redis.set(store.keys.format_version, FORMAT_VERSION)

    assert await ensure_format(store.run, sleep=other_replica_finishes) == "current"
    assert naps == [0.5]
    await store.redis.delete(store.keys.format_version)

    async def nothing(seconds: float) -> None:
        return None

    with pytest.raises(UnknownFormat, match="delete the key"):
        await ensure_format(store.run, wait_s=1.0, sleep=nothing)


async def test_a_replica_that_locks_after_another_finished_does_not_migrate_again(store):
    await store.redis.delete(store.keys.format_version)
    real_set = store.redis.set

    async def set_after_the_other_replica(key, value, **kw):
        if key.endswith(":migrating"):   # the other replica wrote the version and unlocked
            await real_set(store.keys.format_version, FORMAT_VERSION)
        return await real_set(key, value, **kw)

    class Proxy:   # the store as ensure_format sees it, its Redis client's SET observed
        keys = store.keys
        redis = type("R", (), {"__getattr__": lambda self, name: getattr(store.redis, name),
                               "set": staticmethod(set_after_the_other_replica)})()

        async def migrate_run_wide(self, *args):
            raise AssertionError("migrated a namespace already in the current format")

    assert await ensure_format(Proxy()) == "current"
    assert not await store.redis.exists(store.keys.format_version + ":migrating")


async def test_the_scheduler_refuses_to_start_on_a_format_it_does_not_read(redis_url):
    client = connect(redis_url)
    try:
        store = Store(client, "newer")
        await store.prompts.add_prompts([("p", PromptIn(prompt="q"))], 1.0, 1.0, 0)
        await client.set(store.keys.format_version, FORMAT_VERSION + 1)
        app = create_app(Settings(redis_url=redis_url, namespace="newer"))
        with pytest.raises(UnknownFormat):
            async with app.router.lifespan_context(app):
                pass
        await client.delete(store.keys.format_version)
        app = create_app(Settings(redis_url=redis_url, namespace="newer"))
        async with app.router.lifespan_context(app):
            assert app.state.scheduler.format_checked
        assert int(await client.get(store.keys.format_version)) == FORMAT_VERSION
    finally:
        await client.aclose()
