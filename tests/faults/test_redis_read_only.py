"""Redis read-only for a moment, as a primary is after a failover demotes it: the scheduler says
so with 503s while it lasts, and its upkeep (lease expiry, garbage collection) resumes afterwards.

The test's own redis-server is made a replica of an address where nothing listens (`REPLICAOF`:
it keeps its data and serves reads, refuses writes), then a primary again (`REPLICAOF NO ONE`).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis
from sara_client import ServerError, ServiceUnavailableError
from sara_service.embedded import EmbeddedRedis, free_port
from sara_service.store.keys import Keys

from tests.e2e._harness import BernoulliWorker, Ledger, RewardScript, load_synthetic

from ._support import poll_until, sdk_client, serve_process

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

NAMESPACE_PREFIX = "fault-readonly"


def _run(tmp_path, scenario) -> None:
    with EmbeddedRedis(tmp_path / "redis") as store:
        namespace = f"{NAMESPACE_PREFIX}-{uuid.uuid4().hex[:8]}"
        server = serve_process(tmp_path, store.url, namespace, "serve", group_size=4,
                               batch_size=4, seed=0, retention_s=1)
        admin = redis.Redis.from_url(store.url)
        try:
            server.start()
            load_synthetic(server.url, 50, 0)
            asyncio.run(scenario(server.url, admin, Keys(namespace)))
        finally:
            admin.execute_command("REPLICAOF", "NO", "ONE")
            admin.close()
            server.stop()
            print(server.log_tail())


async def _finish_some_groups(client) -> BernoulliWorker:
    worker = BernoulliWorker("w0", [client], RewardScript(0), Ledger(), lease_size=8)
    for _ in range(5):
        await worker.lease_once(wait_s=0.0)
        await worker.flush()
    return worker


def _calls(admin: redis.Redis, command: str) -> int:
    return int(admin.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_upkeep_resumes_after_redis_was_read_only(tmp_path):
    async def scenario(url: str, admin: redis.Redis, keys: Keys) -> None:
        async with sdk_client(url) as client:
            await _finish_some_groups(client)
            assert admin.zcard(keys.gc) > 0
            admin.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))

            def overdue() -> int:
                return admin.zcount(keys.gc, "-inf", time.time())

            # retention (1 s) runs out while Redis is read-only, and the upkeep tries to collect:
            # each tick reads the gc set once in expire_leases' script and once in
            # collect_garbage, so two more reads after the groups fell due mean a collection ran
            await poll_until(overdue, 10, "finished groups past their retention")
            reads = _calls(admin, "zrangebyscore")
            await poll_until(lambda: _calls(admin, "zrangebyscore") >= reads + 2, 10,
                             "a garbage collection while Redis is read-only")
            admin.execute_command("REPLICAOF", "NO", "ONE")
            await poll_until(lambda: overdue() == 0, 10,
                             "garbage collection to resume once Redis is writable again")

    _run(tmp_path, scenario)


def test_read_only_redis_answers_503(tmp_path):
    async def scenario(url: str, admin: redis.Redis, keys: Keys) -> None:
        async with sdk_client(url, max_attempts=1) as client:
            worker = BernoulliWorker("w0", [client], RewardScript(0), Ledger(), lease_size=8)
            await worker.lease_once(wait_s=0.0)
            assert worker.held
            admin.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
            try:
                await worker.report_some()
            except ServerError as exc:  # a 500: read-only not taken for unavailable
                raise AssertionError(f"a write to a read-only Redis answered {exc}") from exc
            except ServiceUnavailableError:
                return
            raise AssertionError("a write to a read-only Redis was accepted")

    _run(tmp_path, scenario)
