"""A lease kept alive by heartbeats stays alive, however long its rollouts take to generate.

Long generations (reasoning models, long contexts) heartbeat their lease every lease_ttl_s / 3 for
as long as they run. Here `SARA_LEASE_TTL_S=2` and `SARA_RETENTION_S=1`, so the lease's Redis keys
get a TTL of 4 x 2 + 1 = 9 s when the lease is granted; the test heartbeats for longer than that.
The sleeps pace the heartbeats (the worker loop's own cadence); nothing waits on them. (A 2 s
lease leaves a heartbeat more than a second of slack on a busy machine.)
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from tests.e2e._harness import load_synthetic

from ._support import sdk_client, serve_process

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

LEASE_TTL_S, RETENTION_S = 2.0, 1.0
KEY_TTL_S = 4 * LEASE_TTL_S + RETENTION_S  # what lease.lua gives the lease keys (scheduler.lease)


def test_heartbeats_keep_a_lease_alive_past_its_key_ttl(redis_server, tmp_path):
    namespace = f"fault-lease-{uuid.uuid4().hex[:8]}"
    server = serve_process(tmp_path, redis_server.url, namespace, "serve", group_size=4,
                           batch_size=4, seed=0, lease_ttl_s=LEASE_TTL_S,
                           retention_s=RETENTION_S)
    try:
        server.start()
        load_synthetic(server.url, 20, 0)
        asyncio.run(_heartbeat_past_key_ttl(server.url))
    finally:
        server.stop()
        print(server.log_tail())


async def _heartbeat_past_key_ttl(url: str) -> None:
    async with sdk_client(url) as client:
        lease = await client.lease("w-long", 1)
        (rollout,) = lease.rollouts
        started, expires_at = time.monotonic(), lease.expires_at
        while time.monotonic() - started < KEY_TTL_S + 2:
            answer = await client.heartbeat(lease.lease_id, "w-long")  # 404: the lease is lost
            assert answer.expires_at > expires_at  # each heartbeat extends it
            expires_at = answer.expires_at
            await asyncio.sleep(LEASE_TTL_S / 3)
        group = await client.get_group(rollout.group_id)
        slot = next(s for s in group.rollouts if s.rollout_id == rollout.rollout_id)
        assert (slot.state, slot.worker_id) == ("leased", "w-long")
        answer = await client.report("w-long", [{
            "rollout_id": rollout.rollout_id, "reward": 1.0, "completion": "long",
            "completion_tokens": 1, "finish_reason": "stop", "policy_version": 0}])
        assert answer.accepted == 1
